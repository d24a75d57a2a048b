"""Analytic prior means of the search core: the ``PriorMean`` protocol and coefficient fits
(``mean``), the transformer job's prior (``transformer``), the registry that rebuilds a saved prior
(``registry``) and the model inputs built from a prior (``features``)."""
