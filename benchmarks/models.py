"""Models the coordinator benchmarks train, built from code (nothing is downloaded).

``small``: the original benchmark model, ``layers`` x Linear(width, width) with GELU.
``deep``: 24 pre-norm transformer blocks (:mod:`pytest_zero3.fixtures.models.transformer`, with the
suite's other models).
"""

import torch
from pytest_zero3.fixtures.models.transformer import Transformer
from torch import nn


def build(name: str, args):
    """The model and a batch maker ``(generator) -> (x, y)`` for benchmark model ``name``."""
    torch.manual_seed(0)
    if name == "small":
        layers = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), nn.GELU()]
        model = nn.Sequential(*layers, nn.Linear(args.width, 1))
        shape = (args.batch, args.width)
    elif name == "deep":
        model = Transformer(args.deep_layers, args.deep_width, heads=4)
        shape = (args.batch, args.seq, args.deep_width)
    else:
        raise ValueError(f"unknown model {name!r}: small or deep")

    def make_batch(generator):
        return torch.randn(*shape, generator=generator), torch.randn(args.batch, 1, generator=generator)

    return model, make_batch


def add_arguments(parser) -> None:
    parser.add_argument("--models", nargs="+", default=["small", "deep"], choices=["small", "deep"])
    parser.add_argument("--layers", type=int, default=8, help="small: Linear layers")
    parser.add_argument("--width", type=int, default=256, help="small: width")
    parser.add_argument("--deep-layers", type=int, default=24, help="deep: transformer blocks")
    parser.add_argument("--deep-width", type=int, default=64, help="deep: model width")
    parser.add_argument("--seq", type=int, default=16, help="deep: sequence length")
    parser.add_argument("--batch", type=int, default=4)
