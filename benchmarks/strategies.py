"""All strategy speed tables in one run: dp vs DDP, overlap on/off (benchmarks/dp.py) and
pp 1F1B vs torch.distributed.pipelining plus the measured bubble table (benchmarks/pp.py).

    python benchmarks/strategies.py [--runs 5] [--steps 6]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dp  # noqa: E402
import pp  # noqa: E402


def main(argv=None):
    print("== data parallel ==")
    dp.main(argv)
    print("\n== pipeline parallel ==")
    pp.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
