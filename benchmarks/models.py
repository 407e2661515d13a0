"""Models the coordinator benchmarks train, built from code (nothing is downloaded).

``small``: the original benchmark model, ``layers`` x Linear(width, width) with GELU.
``deep``: 24 pre-norm transformer blocks (attention + MLP, nine parameterised modules each): many
small modules, so the coordinator's per-hook work is a large share of a step, as in real LLMs
whose layers are split into many hooked submodules.
"""

import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block: LayerNorm, multi-head self-attention, LayerNorm, GELU MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.act = nn.GELU()

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, layers: int = 24, width: int = 64, heads: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean(dim=1)


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
