"""Does the gate catch what the full run catches? Ten one-line mutants say.

    .venv/bin/python .ci/mutants.py                 # every mutant
    .venv/bin/python .ci/mutants.py ID [ID ...]     # the mutants named
    .venv/bin/python .ci/mutants.py --list          # the table, nothing run
    .venv/bin/python .ci/mutants.py --always-full ID  # the full tier too

Each mutant is a realistic one-line bug in python/multigpu (the engines,
the training step, the checkpoints, the inputs). For each one the script
checks that its file has no uncommitted changes (`git diff --quiet`) and
holds the original text exactly once, writes the mutant, and runs

    python -m pytest -x -q -p no:cacheprovider -m "not slow" PATHS

on the mutant's own test files with `MULTIGPU_TEST_TIER=gate` (the gate's
own sample: `MULTIGPU_TEST_ROTATION` is unset unless `--rotation` names
one); only if the gate passes, the same paths with `MULTIGPU_TEST_TIER=full`
(the full tier runs every test of the gate and more, so a mutant the gate
catches the full run catches too; `--always-full` runs it anyway). The
file is restored, with its modification time, whatever happens (the
children write no bytecode, so no stale `.pyc` of a mutant is left). The
JAX engine's mutants run under `KERAS_BACKEND=jax`, the others under
`KERAS_BACKEND=tensorflow`.

One row per mutant: the id, file:line, whether the gate caught it,
whether the full tier did (or `not run (gate caught)`), the seconds, and
the first test that failed; that test is then run again on the restored
file, where it must pass (`--no-confirm` skips this; the seconds include
it). Run it from any directory, one at a time (it edits the working
tree), single-process, as the CI's machine allows.

Exit status: 0 when the gate catches every mutant the full tier catches;
1 when a mutant survives the gate and the full tier catches it (a gap in
the gate's sample: the row names the full-tier test that caught it); 2 when
the table cannot be trusted: a file refused (uncommitted changes, the
original text not there exactly once), a pytest run that neither passed
nor failed tests (no tests, a usage error, a timeout), or a mutant that
both tiers let through (then it is no test of the gate).
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "python/multigpu"
PYTEST_ARGS = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "-m", "not slow")
# Seconds one pytest run of a mutant may take before it counts as an error.
RUN_TIMEOUT = 3600

# id, file (below python/multigpu), the original text (exactly once in the
# file), its replacement, what the bug is, the test paths, the Keras backend.
MUTANTS = [
    {
        "id": "tf-replicate-slice",
        "file": "engines/tensorflow/replicate.py",
        "original": "                [x[bounds[i]:bounds[i + 1]] for x in flat_inputs]",
        "replacement": "                [x[bounds[i]:bounds[i + 1] + 1] for x in flat_inputs]",
        "description": "replicate engine: each replica's slice of the batch "
                       "takes one row of the next share (off by one)",
        "tests": ["tests/python/engines/test_replicate.py",
                  "tests/python/engines/test_template.py"],
    },
    {
        "id": "tf-layer-loss-plain-mean",
        "file": "engines/tensorflow/forward.py",
        "original": "    return tf.add_n(weighted)",
        "replacement": "    return tf.add_n(losses) / len(losses)",
        "description": "replicas' layer-made losses combined by a plain mean, "
                       "not weighted by their rows (wrong reduction)",
        "tests": ["tests/python/engines/test_layer_losses.py",
                  "tests/python/engines/test_replicate.py"],
    },
    {
        "id": "jax-guard-bad-rows",
        "file": "engines/jax/guard.py",
        "original": "bad = (nan | inf).reshape(len(values), -1).any(axis=1)",
        "replacement": "bad = (nan | inf).reshape(len(values), -1).all(axis=1)",
        "description": "JAX NaN/inf guard: a row counts as bad only when all "
                       "its values are (all for any)",
        "tests": ["tests/python/engines/jax/test_jax_guard.py"],
        "backend": "jax",
    },
    {
        "id": "jax-mesh-keep-replicated",
        "file": "engines/jax/mesh.py",
        "original": 'if getattr(value, "sharding", None) != sharding]',
        "replacement": 'if getattr(value, "sharding", None) == sharding]',
        "description": "JAX mesh: the state's arrays already on every device "
                       "are re-placed, the stray ones left (flipped comparison)",
        "tests": ["tests/python/engines/jax/test_jax_engine.py",
                  "tests/python/engines/jax/test_jax_guard.py"],
        "backend": "jax",
    },
    {
        "id": "step-rows-scaling-dropped",
        "file": "step/train_step.py",
        "original": "rows * context.num_replicas_in_sync / tf.maximum(total, 1.0),",
        "replacement": "1.0 * context.num_replicas_in_sync / tf.maximum(total, 1.0),",
        "description": "training step: a replica's loss is no longer weighed "
                       "by its rows before the gradients are summed",
        "tests": ["tests/python/engines/test_mirrored.py",
                  "tests/python/step/test_accumulation.py"],
    },
    {
        "id": "step-guard-any-replica",
        "file": "step/guard.py",
        "original": "else tf.reduce_all(tf.stack(oks))",
        "replacement": "else tf.reduce_any(tf.stack(oks))",
        "description": "NaN/inf guard: one replica's finite share passes the "
                       "batch for all of them (reduce_any for reduce_all)",
        "tests": ["tests/python/step/test_nonfinite.py",
                  "tests/python/step/test_stateless.py"],
    },
    {
        "id": "ckpt-epoch-end-not-written",
        "file": "checkpoints/model_checkpoint.py",
        "original": "        self._save(final)",
        "replacement": "        pass",
        "description": "AtomicModelCheckpoint: the epoch-end model is not "
                       "written (a skipped write of a checkpoint)",
        "tests": ["tests/python/checkpoints/test_checkpoints.py",
                  "tests/python/checkpoints/test_atomic.py"],
    },
    {
        "id": "ckpt-prune-keeps-one-more",
        "file": "checkpoints/listing.py",
        "original": "list_checkpoints(checkpoint_dir)[max_to_keep:]",
        "replacement": "list_checkpoints(checkpoint_dir)[max_to_keep + 1:]",
        "description": "checkpoint pruning keeps max_to_keep + 1 models "
                       "(off by one)",
        "tests": ["tests/python/checkpoints/test_checkpoints.py"],
    },
    {
        "id": "inputs-label-equal-to-classes",
        "file": "inputs/labels.py",
        "original": "(by_row >= classes)",
        "replacement": "(by_row > classes)",
        "description": "label check: a label equal to the number of classes "
                       "is accepted (off by one)",
        "tests": ["tests/python/distribute/test_inputs.py"],
    },
    {
        "id": "inputs-zero-rows-accepted",
        "file": "inputs/data.py",
        "original": "    if _row_counts(value) == {0}:",
        "replacement": "    if _row_counts(value) == {}:",
        "description": "row check no longer refuses data of 0 rows (a set "
                       "compared with a dict is never equal)",
        "tests": ["tests/python/distribute/test_inputs.py",
                  "tests/python/distribute/test_datasets.py"],
    },
]

# pytest's exit codes: tests passed, tests failed, a collection or
# import error (the mutant broke loading the tests: caught too).
PASSED, FAILED, INTERRUPTED = 0, 1, 2


class Refused(Exception):
    """A mutant that cannot be applied safely."""


def path_of(mutant):
    return os.path.join(PACKAGE, mutant["file"])


def line_of(mutant):
    """The 1-based line where the original text starts (None if absent)."""
    with open(os.path.join(ROOT, path_of(mutant)), encoding="utf-8") as file:
        text = file.read()
    at = text.find(mutant["original"])
    return None if at < 0 else text.count("\n", 0, at) + 1


def check(mutant):
    """Raises `Refused` unless the mutant can be applied and undone safely."""
    path = path_of(mutant)
    full = os.path.join(ROOT, path)
    if "\n" in mutant["original"] or "\n" in mutant["replacement"]:
        raise Refused(f"{mutant['id']}: a mutant changes one line")
    if mutant["original"] == mutant["replacement"]:
        raise Refused(f"{mutant['id']}: the replacement is the original")
    if not os.path.isfile(full):
        raise Refused(f"{mutant['id']}: {path} does not exist")
    tracked = subprocess.run(
        ["git", "ls-files", "--error-unmatch", "--", path], cwd=ROOT,
        capture_output=True)
    if tracked.returncode != 0:
        raise Refused(f"{mutant['id']}: {path} is not tracked by git")
    for staged in ((), ("--cached",)):
        if subprocess.run(["git", "diff", "--quiet", *staged, "--", path],
                          cwd=ROOT).returncode != 0:
            raise Refused(f"{mutant['id']}: {path} has uncommitted changes; "
                          "commit or stash them first")
    with open(full, encoding="utf-8") as file:
        count = file.read().count(mutant["original"])
    if count != 1:
        raise Refused(f"{mutant['id']}: {path} holds the original text "
                      f"{count} times, not once: {mutant['original']!r}")
    for test in mutant["tests"]:
        if not os.path.exists(os.path.join(ROOT, test.split("::")[0])):
            raise Refused(f"{mutant['id']}: no test path {test}")


def environment(mutant, tier, rotation):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["MULTIGPU_TEST_TIER"] = tier
    env["KERAS_BACKEND"] = mutant.get("backend", "tensorflow")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("MULTIGPU_TIER_REPORT", None)
    env.pop("MULTIGPU_TEST_ROTATION", None)
    if rotation is not None:
        env["MULTIGPU_TEST_ROTATION"] = str(rotation)
    return env


_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S.*)$", re.MULTILINE)


def node_id(rest):
    """The test id that starts `rest`, the text after a summary's FAILED.

    Its parameters may hold spaces and brackets (`test_x[a [b]]`): the id
    ends at the bracket that closes its first `[`, else at the first space.
    """
    name_end = min((i for i in (rest.find(" "), rest.find("[")) if i >= 0),
                   default=len(rest))
    if rest[name_end:name_end + 1] != "[":
        return rest[:name_end]
    depth = 0
    for i in range(name_end, len(rest)):
        depth += {"[": 1, "]": -1}.get(rest[i], 0)
        if depth == 0:
            return rest[:i + 1]
    return rest.split(" - ", 1)[0]


def run_tier(mutant, tier, rotation, log):
    """One pytest run of the mutant's tests in `tier`.

    Returns:
        `(caught, first failed test or None, pytest's exit status)`;
        `caught` is None when the run neither passed nor failed tests.
    """
    command = [sys.executable, *PYTEST_ARGS, *mutant["tests"]]
    try:
        done = subprocess.run(command, cwd=ROOT, env=environment(
            mutant, tier, rotation), capture_output=True, text=True,
            timeout=RUN_TIMEOUT)
        output, status = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode(errors="replace") if isinstance(
            expired.stdout, bytes) else (expired.stdout or "")
        output += f"\n(timed out after {RUN_TIMEOUT} s)"
        status = None
    if log:
        with open(log, "a", encoding="utf-8") as file:
            file.write(f"===== {mutant['id']} {tier}: {' '.join(command)}\n"
                       f"{output}\n===== exit status {status}\n")
    failed = _FAILED_LINE.search(output)
    first = node_id(failed[1].rstrip()) if failed else None
    if status == PASSED:
        return False, None, status
    if status == FAILED:
        return True, first, status
    if status == INTERRUPTED:
        return True, first or "(collection error)", status
    tail = "\n".join(output.strip().splitlines()[-15:])
    print(f"{mutant['id']} {tier}: pytest exited {status}:\n{tail}",
          file=sys.stderr)
    return None, first, status


def _raise_on_signal(number, frame):
    del frame
    raise SystemExit(128 + number)


def run_mutant(mutant, rotation, always_full, log, confirm=True):
    """Applies the mutant, runs its tiers, restores the file.

    Returns:
        A dict: `gate`, `full` (True, False, None when not run, "error"),
        `seconds` and `caught_by`.
    """
    check(mutant)
    full_path = os.path.join(ROOT, path_of(mutant))
    with open(full_path, "rb") as file:
        original = file.read()
    stat = os.stat(full_path)
    mutated = original.replace(mutant["original"].encode(),
                               mutant["replacement"].encode(), 1)
    started = time.monotonic()
    result = {"gate": None, "full": None, "caught_by": None}
    try:
        with open(full_path, "wb") as file:
            file.write(mutated)
        # A modification time of its own, so that no bytecode of the
        # original is taken for the mutant.
        later = max(time.time(), stat.st_mtime + 2)
        os.utime(full_path, (later, later))
        gate, first, _ = run_tier(mutant, "gate", rotation, log)
        result["gate"] = "error" if gate is None else gate
        if gate:
            result["caught_by"] = first
        if gate is not None and (not gate or always_full):
            full, first_full, _ = run_tier(mutant, "full", rotation, log)
            result["full"] = "error" if full is None else full
            if full and not gate:
                result["caught_by"] = first_full
    finally:
        with open(full_path, "wb") as file:
            file.write(original)
        os.utime(full_path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    if subprocess.run(["git", "diff", "--quiet", "--", path_of(mutant)],
                      cwd=ROOT).returncode != 0:
        raise RuntimeError(f"{path_of(mutant)} was not restored: check it "
                           "with git diff")
    test = result["caught_by"]
    if confirm and test and "::" in test:
        # The test that caught the mutant passes on the original code, or
        # it caught nothing of the mutant's.
        tier = "gate" if result["gate"] is True else "full"
        passes, _, _ = run_tier(dict(mutant, tests=[test]), tier, rotation,
                                log)
        if passes is not False:
            result["caught_by"] = f"{test} (fails without the mutant too)"
            result["gate" if tier == "gate" else "full"] = "error"
    result["seconds"] = time.monotonic() - started
    return result


def yes_no(value, gate=None):
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if value is None:
        return "not run (gate caught)" if gate is True else "-"
    return str(value)


COLUMNS = ("id", "file:line", "gate caught", "full caught", "seconds",
           "caught by")


def print_row(values, widths):
    print("  ".join(str(v).ljust(w) for v, w in zip(values, widths)).rstrip(),
          flush=True)


def widths_for(mutants):
    return (max(len(COLUMNS[0]), *(len(m["id"]) for m in mutants)),
            max(len(COLUMNS[1]), *(len(path_of(m)) + 5 for m in mutants)),
            11, 21, 7, 0)


def list_table(mutants):
    widths = (max(len("id"), *(len(m["id"]) for m in mutants)),
              max(len("file:line"), *(len(path_of(m)) + 5 for m in mutants)))
    print_row(("id", "file:line", "description / original -> replacement "
               "/ tests"), widths + (0,))
    for mutant in mutants:
        line = line_of(mutant)
        where = f"{path_of(mutant)}:{line if line else '?'}"
        print_row((mutant["id"], where, mutant["description"]), widths + (0,))
        pad = " " * (widths[0] + widths[1] + 4)
        print(f"{pad}- {mutant['original'].strip()}")
        print(f"{pad}+ {mutant['replacement'].strip()}")
        backend = mutant.get("backend", "tensorflow")
        print(f"{pad}KERAS_BACKEND={backend} {' '.join(mutant['tests'])}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", metavar="ID",
                        help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true",
                        help="print the table of mutants and run nothing")
    parser.add_argument("--always-full", action="store_true",
                        help="run the full tier even when the gate caught "
                             "the mutant")
    parser.add_argument("--rotation", type=int, default=None,
                        help="MULTIGPU_TEST_ROTATION for both tiers "
                             "(default: unset, the gate's own sample)")
    parser.add_argument("--no-confirm", action="store_true",
                        help="do not rerun the catching test on the "
                             "restored file (by default it must pass there)")
    parser.add_argument("--log", default=None,
                        help="append every pytest run's output to this file")
    args = parser.parse_args(argv)

    ids = [m["id"] for m in MUTANTS]
    if len(set(ids)) != len(ids):
        print("mutants.py: two mutants share an id", file=sys.stderr)
        return 2
    unknown = [i for i in args.ids if i not in ids]
    if unknown:
        print(f"mutants.py: no mutant {', '.join(unknown)}; known: "
              f"{', '.join(ids)}", file=sys.stderr)
        return 2
    chosen = [m for m in MUTANTS if not args.ids or m["id"] in args.ids]
    if args.list:
        list_table(chosen)
        return 0
    try:
        for mutant in chosen:
            check(mutant)
    except Refused as refused:
        print(f"mutants.py: refused: {refused}", file=sys.stderr)
        return 2

    signal.signal(signal.SIGTERM, _raise_on_signal)
    widths = widths_for(chosen)
    print_row(COLUMNS, widths)
    started = time.monotonic()
    gaps, broken = [], []
    for mutant in chosen:
        where = f"{path_of(mutant)}:{line_of(mutant)}"
        try:
            result = run_mutant(mutant, args.rotation, args.always_full,
                                args.log, confirm=not args.no_confirm)
        except Refused as refused:
            print(f"mutants.py: refused: {refused}", file=sys.stderr)
            return 2
        gate, full = result["gate"], result["full"]
        print_row((mutant["id"], where, yes_no(gate), yes_no(full, gate),
                   f"{result['seconds']:.0f}", result["caught_by"] or ""),
                  widths)
        if gate is False and full is True:
            gaps.append((mutant["id"], result["caught_by"]))
        elif "error" in (gate, full) or (gate is False and full is False):
            broken.append(mutant["id"])
        elif gate is True and full is False:
            # The full tier holds every test of the gate: a flaky test.
            broken.append(mutant["id"])
    print(f"total: {time.monotonic() - started:.0f} s for {len(chosen)} "
          f"mutant(s)", flush=True)
    for mutant_id, test in gaps:
        print(f"GAP: {mutant_id} survives the gate; the full tier's {test} "
              "catches it", flush=True)
    if broken:
        print(f"not a test of the gate (an error, a mutant both tiers let "
              f"through, or tiers that disagree the wrong way): "
              f"{', '.join(broken)}", flush=True)
    if gaps:
        return 1
    return 2 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
