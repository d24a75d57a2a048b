"""The harness counts the tokens fed to the model and the optimizer steps itself."""

from __future__ import annotations

import torch
from torch import nn

from infrarsi.execution.counters import DIGEST_PRIME, HarnessCounters, token_digest


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


def test_a_steps_digest_is_the_data_not_the_split_nor_the_sequence_order() -> None:
    g = torch.Generator().manual_seed(0)
    step = torch.randint(0, 50_000, (8, 16), generator=g)
    whole = int(token_digest(step))
    assert whole == sum(
        int(token_digest(step[i : i + 2])) for i in range(0, 8, 2)
    )  # 4 micro-batches
    assert whole == int(token_digest(step[torch.randperm(8, generator=g)]))  # sequences reordered
    swapped = step.clone()
    swapped[3, [2, 9]] = swapped[3, [9, 2]]  # two tokens of one sequence trade places
    if swapped[3, 2] != swapped[3, 9]:
        assert int(token_digest(swapped)) != whole
    other = step.clone()
    other[5, 0] += 1  # one token differs
    assert int(token_digest(other)) != whole
    assert int(token_digest(step[:1])) != int(token_digest(step[1:2]))  # another sequence


def test_a_steps_digest_stays_exact_in_float64() -> None:
    ids = torch.full((4, 2048), 49_999)
    d = int(token_digest(ids))
    assert 0 < d < 4 * 2048 * DIGEST_PRIME
    assert float(d) == d  # the all-reduce's dtype holds it exactly


def test_the_counters_digest_a_step_and_start_again() -> None:
    model = nn.Embedding(100, 4)
    counters = HarnessCounters().attach(model)
    counters.begin_step()
    assert float(counters.digest_on("cpu")) == 0.0  # nothing fed yet
    ids = torch.arange(40).reshape(4, 10)
    model(ids[:2])
    model(ids[2:])
    with torch.no_grad():
        model(ids + 1)  # an eval forward: not training data
    assert float(counters.digest_on("cpu")) == float(token_digest(ids))
    counters.begin_step()
    assert float(counters.digest_on("cpu")) == 0.0
    counters.detach()
