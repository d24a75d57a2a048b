"""A Hugging Face ``Trainer`` script, the kind a team already has; infrarsi tunes it unchanged.

Today it is launched as::

    deepspeed --num_gpus 2 hf_trainer.py --deepspeed hf_ds.json --per_device_train_batch_size 1 \\
        --gradient_accumulation_steps 8 --max_steps 1000 --output_dir /tmp/hf_trainer_out --report_to none

and ``infrarsi init --script "<that line>" --study DIR`` writes its workload (``hf_trainer.yaml``
beside this file is the same, written by hand). Nothing in here knows about infrarsi: a tiny Llama
built from a config with random weights (no download), a synthetic dataset whose rows are a pure
function of their index (a noisy affine chain, learnable), and ``Trainer`` with the arguments
``HfArgumentParser`` reads from the command line, ``--deepspeed hf_ds.json`` among them. The
DeepSpeed config leaves the batch, accumulation and precision ``auto``: the Trainer fills them
from its arguments, which is where infrarsi puts each trial's values.

It needs ``transformers`` and ``accelerate`` (the Trainer's way into DeepSpeed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    """The tiny model and its data."""

    seq_len: int = field(default=64, metadata={"help": "Tokens per sequence."})
    vocab: int = field(default=512, metadata={"help": "Vocabulary size."})
    dim: int = field(default=64, metadata={"help": "Hidden size."})
    layers: int = field(default=2, metadata={"help": "Decoder layers."})
    rows: int = field(default=65536, metadata={"help": "Rows in the synthetic dataset."})


class ChainDataset(torch.utils.data.Dataset):
    """Row ``i``: a noisy affine chain of token ids fixed by ``i`` alone (any batch split sees the same rows)."""

    def __init__(self, rows: int, seq_len: int, vocab: int) -> None:
        self.rows, self.seq_len, self.vocab = rows, seq_len, vocab

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(1_000_003 + i)
        x = torch.empty(self.seq_len, dtype=torch.long)
        x[0] = torch.randint(0, self.vocab, (1,), generator=g)
        for t in range(1, self.seq_len):
            x[t] = (x[t - 1] * 7 + 3) % self.vocab
        noise = torch.rand(self.seq_len, generator=g) < 0.1
        x = torch.where(noise, torch.randint(0, self.vocab, x.shape, generator=g), x)
        return {"input_ids": x, "labels": x.clone()}


def main() -> None:
    model_args, args = HfArgumentParser(
        (ModelArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=model_args.vocab,
        hidden_size=model_args.dim,
        intermediate_size=4 * model_args.dim,
        num_hidden_layers=model_args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=model_args.seq_len,
    )
    model = LlamaForCausalLM(config)
    data = ChainDataset(model_args.rows, model_args.seq_len, model_args.vocab)
    Trainer(model=model, args=args, train_dataset=data).train()


if __name__ == "__main__":
    main()
