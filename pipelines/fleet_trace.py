"""Writes fleet-trace.jsonl, the sample trace of fleet.toml (Mooncake JSONL, 64-token hash blocks).

600 requests arriving as a Poisson stream at 40 per second; each prompt is one of 8 shared
system prompts (8 to 24 blocks) followed by 1 to 8 blocks of its own; outputs are lognormal
around 96 tokens.  Seeded: running it again writes the same file.

    python pipelines/fleet_trace.py
"""

import json
import os

import numpy as np

REQUESTS, RATE, UNIT, SEED = 600, 40.0, 64, 7


def main(path: str) -> None:
    rng = np.random.default_rng(SEED)
    groups = [list(range(g * 100, g * 100 + int(rng.integers(8, 25)))) for g in range(8)]
    t, fresh = 0.0, 100000
    with open(path, "w") as f:
        for _ in range(REQUESTS):
            t += rng.exponential(1.0 / RATE)
            shared = groups[int(rng.integers(0, len(groups)))]
            own = int(rng.integers(1, 9))
            ids = shared + list(range(fresh, fresh + own))
            fresh += own
            prompt = (len(ids) - 1) * UNIT + int(rng.integers(1, UNIT + 1))
            output = int(np.clip(rng.lognormal(np.log(96), 0.6), 8, 512))
            f.write(json.dumps({"timestamp": round(t * 1000, 1), "input_length": prompt, "output_length": output,
                                "hash_ids": ids}) + "\n")


if __name__ == "__main__":
    main(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fleet-trace.jsonl"))
