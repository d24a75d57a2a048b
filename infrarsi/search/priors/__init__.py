"""The analytic prior means of the search core and the model inputs built from them.

The ``PriorMean`` protocol and coefficient fits (``mean``), the transformer job's prior
(``transformer``), the registry that rebuilds a saved prior (``registry``) and the model inputs
with the prior's columns (``features``).
"""
