"""Fast marginal posteriors for scoring tens of thousands of candidates.

BoTorch's ``posterior`` goes through lazy tensors and prediction strategies, which costs far more
than the arithmetic on a few thousand candidates. These predictors cache the training-side
factorisation once per fitted model and then need one kernel matrix per chunk of candidates. They
evaluate the models' own mean and kernel modules, so any kernel works; a unit test checks them
against ``model.posterior``.
"""

from __future__ import annotations

import torch
from botorch.models import SingleTaskGP, SingleTaskVariationalGP

CHUNK = 8192


class ExactMarginal:
    """Marginal posterior (latent) of a ``SingleTaskGP`` with a ``Standardize`` outcome transform."""

    def __init__(self, model: SingleTaskGP, untried_variance_cut: float = 0.0) -> None:
        self.untried_variance_cut = float(untried_variance_cut)
        """Variance (original units) the acquisition takes off configs not among the training
        inputs (``time_gp.acquisition_variance_cut``; 0: none)."""
        with torch.no_grad():
            self.model = model
            X = model.train_inputs[0]
            y = model.train_targets
            self.X = X
            K = model.covar_module(X).to_dense()
            noise = model.likelihood.noise.reshape(-1)
            K = K + torch.diag_embed(noise.expand(X.shape[0]))
            self.L = torch.linalg.cholesky(K + 1e-8 * torch.eye(X.shape[0], dtype=X.dtype))
            resid = (y - model.mean_module(X)).unsqueeze(-1)
            self.alpha = torch.cholesky_solve(resid, self.L).squeeze(-1)
            tf = getattr(model, "outcome_transform", None)
            self.mu = float(tf.means.reshape(-1)[0]) if tf is not None else 0.0
            self.sd = float(tf.stdvs.reshape(-1)[0]) if tf is not None else 1.0

    def __call__(self, Xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance (original units), each ``(n,)``, of the latent function at ``Xc`` (``(n, d)``)."""
        means, vars_ = [], []
        with torch.no_grad():
            for i in range(0, Xc.shape[0], CHUNK):
                x = Xc[i : i + CHUNK]
                Ks = self.model.covar_module(self.X, x).to_dense()
                m = self.model.mean_module(x) + Ks.mT @ self.alpha
                v = torch.linalg.solve_triangular(self.L, Ks, upper=False)
                kd = self.model.covar_module(x, diag=True)
                var = (kd - (v * v).sum(0)).clamp_min(1e-12)
                means.append(m * self.sd + self.mu)
                vars_.append(var * self.sd**2)
        return torch.cat(means), torch.cat(vars_)

    def joint(self, Xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``(n,)`` and covariance ``(n, n)`` (original units) of the latent function at the
        few rows of ``Xc`` (``(n, d)``; one dense block, so keep ``n`` small)."""
        with torch.no_grad():
            Ks = self.model.covar_module(self.X, Xc).to_dense()
            m = self.model.mean_module(Xc) + Ks.mT @ self.alpha
            v = torch.linalg.solve_triangular(self.L, Ks, upper=False)
            cov = self.model.covar_module(Xc).to_dense() - v.mT @ v
        return m * self.sd + self.mu, cov * self.sd**2

    def untried(self, Xc: torch.Tensor) -> torch.Tensor:
        """``(n,)`` bool: True where a row of ``Xc`` is not one of the training inputs."""
        out = []
        with torch.no_grad():
            for i in range(0, Xc.shape[0], CHUNK):
                # exact distances: the matmul form of cdist leaves ~1e-8 on identical rows
                d = torch.cdist(
                    Xc[i : i + CHUNK], self.X, compute_mode="donot_use_mm_for_euclid_dist"
                )
                out.append(d.amin(-1) > 1e-9)
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


class VariationalMarginal:
    """Marginal posterior (latent) of a whitened ``SingleTaskVariationalGP``."""

    def __init__(self, model: SingleTaskVariationalGP) -> None:
        with torch.no_grad():
            gp = model.model
            strat = gp.variational_strategy
            dist = strat._variational_distribution
            self.gp = gp
            self.Z = strat.inducing_points
            Kzz = gp.covar_module(self.Z).to_dense()
            self.L = torch.linalg.cholesky(
                Kzz + strat.jitter_val * torch.eye(self.Z.shape[0], dtype=Kzz.dtype)
            )
            self.m = dist.variational_mean.detach().clone()
            Lq = dist.chol_variational_covar.detach().tril()
            self.S_minus_I = Lq @ Lq.mT - torch.eye(self.Z.shape[0], dtype=Kzz.dtype)

    def __call__(self, Xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance, each ``(n,)``, of the latent function at ``Xc`` (``(n, d)``)."""
        means, vars_ = [], []
        with torch.no_grad():
            for i in range(0, Xc.shape[0], CHUNK):
                x = Xc[i : i + CHUNK]
                A = torch.linalg.solve_triangular(
                    self.L, self.gp.covar_module(self.Z, x).to_dense(), upper=False
                )
                means.append(self.gp.mean_module(x) + A.mT @ self.m)
                kd = self.gp.covar_module(x, diag=True)
                vars_.append((kd + (A * (self.S_minus_I @ A)).sum(0)).clamp_min(1e-12))
        return torch.cat(means), torch.cat(vars_)
