"""The accelerator catalogue is the one source of GPU figures for the surrogate, the prior and MFU."""

from __future__ import annotations

from infrarsi import datasheets
from infrarsi.execution import flops
from infrarsi.search.priors.transformer import transformer_shape
from infrarsi.workload_prior import CUDA_NOMINAL


def test_every_kind_is_named_by_its_key_and_has_positive_figures() -> None:
    for key, spec in datasheets.GPUS.items():
        assert spec.name == key
        assert (
            min(
                spec.peak_flops,
                spec.memory_bytes,
                spec.hbm_bytes_per_s,
                spec.nvlink_bytes_per_s,
                spec.internode_bytes_per_s,
                spec.pcie_bytes_per_s,
            )
            > 0
        )


def test_mfu_peaks_of_catalogued_kinds_are_the_catalogue_figures() -> None:
    assert flops.GPU_PEAK_BF16_FLOPS["H100"] == datasheets.GPUS["h100_sxm"].peak_flops
    assert flops.GPU_PEAK_BF16_FLOPS["A100"] == datasheets.GPUS["a100_sxm"].peak_flops


def test_the_prior_starts_from_the_nominal_gpu() -> None:
    g = datasheets.NOMINAL_GPU
    assert (
        CUDA_NOMINAL["peak_flops"] == g.peak_flops
        and CUDA_NOMINAL["inter_bytes_per_s"] == g.internode_bytes_per_s
    )
    shape = transformer_shape(
        n_layers=2,
        hidden=64,
        n_heads=4,
        vocab=128,
        seq_len=32,
        global_batch=8,
        world_size=8,
        num_params=1e6,
    )
    assert (shape.peak_flops, shape.memory_bytes_per_s, shape.host_bytes_per_s) == (
        g.peak_flops,
        g.hbm_bytes_per_s,
        g.pcie_bytes_per_s,
    )


def test_the_surrogate_simulates_a_catalogued_kind() -> None:
    from infrarsi.execution.surrogate.model import problem_from_params

    p = problem_from_params(
        world_size=16, global_batch=64, seq_len=2048, params={"gpu": "a100_sxm"}, model_size="8b"
    )
    assert p.gpu is datasheets.GPUS["a100_sxm"]
