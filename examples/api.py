"""lengthgen from Python, end to end: train a looped model and a next-token baseline on Parity up
to length 12, test both to length 24, and print accuracy by length side by side (docs/api.md).

    python examples/api.py                       # about 2 minutes on 2 cores
    python examples/api.py --steps 200 --out runs/api-quick

Each run folder is a normal lengthgen run: `lengthgen eval`, `lengthgen report` and
`lengthgen export` take it as well.
"""
import argparse

import lengthgen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the presets')")
    parser.add_argument("--out", default="runs/api", help="where the two run folders go")
    parser.add_argument("--samples", type=int, default=256, help="test samples per length")
    args = parser.parse_args()

    overrides = {"train.steps": args.steps} if args.steps else {}
    accuracy = {}
    for method in ("looped", "ntp"):
        run = lengthgen.train("looped/cpu/parity", {**overrides, "method": method}, out=f"{args.out}/{method}",
                              force=True, progress=False)
        rows = run.evaluate(lengths=[6, 12, 18, 24], samples=args.samples, progress=False)
        accuracy[method] = {row["length"]: row["accuracy"] for row in rows}
        print(f"{method}: trained {run.step} steps in {run.folder}")

    print(f"\n{'length':>6} {'looped':>8} {'ntp':>8}   (chance 0.5; trained on lengths 1-12)")
    for length in accuracy["looped"]:
        print(f"{length:>6} {accuracy['looped'][length]:>8.3f} {accuracy['ntp'][length]:>8.3f}")
    report = lengthgen.report([f"{args.out}/looped", f"{args.out}/ntp"], out=args.out)
    print(f"\nreport: {report.path}")


if __name__ == "__main__":
    main()
