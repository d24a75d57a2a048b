"""The harness counts the tokens fed to the model and the optimizer steps itself."""

from __future__ import annotations

import torch
from torch import nn

from infrarsi.execution.counters import HarnessCounters


def test_harness_counters_see_token_ids_passed_by_keyword_too() -> None:
    class ByKeyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.emb(input_ids)

    model = ByKeyword()
    counters = HarnessCounters().attach(model)
    counters.begin_step()
    model(torch.zeros(2, 5, dtype=torch.long))  # positional
    model(input_ids=torch.zeros(3, 5, dtype=torch.long))  # keyword (a Hugging Face call)
    assert (counters.step_tokens, counters.step_rows) == (25, 5)
    counters.detach()


def test_only_a_real_optimizer_step_counts() -> None:
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    counters = HarnessCounters().attach(model)
    counters.watch_optimizer(opt)
    counters.begin_step()
    assert counters.end_step() == 0  # no step taken
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert counters.end_step() == 1
    assert counters.end_step() == 0  # read once
    counters.detach()
