"""One oracle: no scenario compares with plain torch outside the twin (``fixtures/twin.py``).

Why (issue 38): every family that drew its own plain-torch twin got the effective config wrong
somewhere (no 1/GAS scaling, a step every micro-batch, fp32 tolerance under bf16), and a fork's
production config then failed a correct implementation.  A plain-torch optimizer, clipping, the twin's
autocast or a tolerance comparison written anywhere else is the start of a second oracle: this check
reads the source of the suite and the scenarios and names each such line.
"""

import re

from conftest import ROOT

#: What only the twin does: build a plain-torch optimizer, clip, run a forward under the twin's
#: autocast, compare within a tolerance.
SECOND_ORACLE = re.compile(
    r"torch\.optim\.(?!lr_scheduler)|clip_grad_norm_|plain_precision\(|\ballclose\(|\bisclose\(|compare_tensors"
)
#: Where the twin lives (and precision.py, which keeps the autocast wrapper the twin calls); and the
#: frameworks family, whose subject is a user's own loop (its optimizer, its clipping), run once under
#: ZeRO-3 and once under DDP and compared through twin.compare.
ALLOWED = {"fixtures/twin.py", "fixtures/precision.py", "fixtures/frameworks.py"}


def test_no_comparison_with_plain_torch_outside_the_twin():
    found = []
    for folder in ("fixtures", "conformance"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if SECOND_ORACLE.search(line) and not line.lstrip().startswith("#"):
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, (
        "a second plain-torch oracle outside fixtures/twin.py (build the twin with twin.Twin/twin.train "
        "and compare through twin.lockstep/grad_problems/weight_problems/tensor_problem):\n" + "\n".join(found)
    )
