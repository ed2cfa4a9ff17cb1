"""The token saving of ``error.text`` over Jupyter's coloured ``traceback``, on ten real errors.

    python -m bench.tracebacks

Ten everyday mistakes run in a real sandbox; for each, the traceback as Jupyter sends it (ANSI
colour codes, joined by newlines) is compared with ``error.text`` (the same, plain). No
tokenizer is installed here, so three tokenizer-free proxies are printed: characters, UTF-8
bytes / 4 (the usual rule of thumb for English-like text under BPE tokenizers), and a word
count that splits runs of letters and digits from each punctuation mark (``\\w+|[^\\w\\s]``),
which is how BPE vocabularies treat escape sequences such as ``\\x1b[0;31m`` (several tokens).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import tempfile
from pathlib import Path

from kernel_pool import KernelPool, PoolSettings, Profile

ERRORS = {
    "ZeroDivisionError": "def ratio(a, b):\n    return a / b\nratio(1, 0)",
    "NameError": "print(undefined_variable)",
    "KeyError": "d = {'a': 1}\nd['b']",
    "IndexError": "[1, 2, 3][10]",
    "TypeError": "'1' + 1",
    "AttributeError": "import numpy as np\nnp.arange(3).lenght",
    "ModuleNotFoundError": "import not_a_module",
    "pandas KeyError": "import pandas as pd\npd.DataFrame({'a': [1]})['missing']",
    "numpy broadcast": "import numpy as np\nnp.ones((3, 2)) + np.ones((4, 5))",
    "SyntaxError": "def f(:\n    pass",
}
WORDS = re.compile(r"\w+|[^\w\s]")


def measures(text: str) -> tuple[int, int, int]:
    return len(text), len(text.encode()) // 4, len(WORDS.findall(text))


async def main() -> None:
    state = Path(tempfile.mkdtemp(prefix="rg-bench-", dir="/tmp"))
    pool = KernelPool(PoolSettings(state_dir=state, profiles={"default": Profile(min_idle=0)},
                                   owner=f"bench-{secrets.token_hex(4)}"))
    await pool.start()
    rows = []
    try:
        session = await pool.create_session()
        for name, code in ERRORS.items():
            error = (await session.execute(code)).error
            assert error is not None and "\x1b" not in error.text
            rows.append((name, measures(error.traceback), measures(error.text)))
    finally:
        await pool.close()
        shutil.rmtree(state, ignore_errors=True)
    print(f"{'error':22} {'chars':>13} {'bytes/4':>11} {'words':>11}")
    for name, coloured, plain in rows:
        cells = " ".join(f"{c:>5}->{p:<5}" for c, p in zip(coloured, plain, strict=True))
        print(f"{name:22} {cells}")
    totals = [(sum(r[1][i] for r in rows), sum(r[2][i] for r in rows)) for i in range(3)]
    print("total (ten tracebacks): " + ", ".join(
        f"{label} {c} -> {p} ({100 * (c - p) / c:.0f}% fewer)"
        for label, (c, p) in zip(("chars", "bytes/4", "words"), totals, strict=True)))


if __name__ == "__main__":
    asyncio.run(main())
