"""The `mpjob` command: run, status, validate, crd, operator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mpjob.pipes import to_nowhere


def _validate(argv: list[str]) -> int:
    from mpjob.kinds import Skipped, listed_items
    from mpjob.validation import InvalidManifest, check_document, check_text, read_manifest
    from mpjob_contract.spec_warnings import warning_lines

    parser = argparse.ArgumentParser(
        prog="mpjob validate",
        description="Check manifests against the CRD's rules. Documents of other kinds (a PersistentVolumeClaim "
        "applied beside the jobs) are named as skipped; a kind: List's items are checked as documents; the files "
        "must hold at least one MixedPrecisionJob.",
    )
    parser.add_argument("files", nargs="+", help="manifest files (`-` reads stdin; name it once)")
    args = parser.parse_args(argv)
    if (stdin := args.files.count("-")) > 1:
        parser.error(f"`-` (stdin) is given {stdin} times; it is read once: name it once")
    failed, found = False, 0
    for path in args.files:
        skipped: list[Skipped] = []
        try:
            jobs, problems = check_text(read_manifest(path), path, skipped)
            in_lists = listed_items(skipped, check_document)  # kind: List, as `kubectl get -o yaml` writes
            jobs, problems = jobs + in_lists[0], problems + in_lists[1]
        except InvalidManifest as exc:
            jobs, problems = [], exc.problems
        for note in skipped:
            print(note)
        for problem in problems:
            print(problem)
        for line in (line for job in jobs for line in warning_lines(job.spec, path)):
            print(line)  # a setting that never applies: the job still runs (mpjob_contract.spec_warnings)
        found += len(jobs)
        if problems:
            failed = True
        elif jobs:
            print(f"{path}: ok ({len(jobs)} MixedPrecisionJob{'s' if len(jobs) != 1 else ''})")
        else:
            print(f"{path}: no MixedPrecisionJob, only other kinds")
    if not failed and not found:
        print(f"error: no MixedPrecisionJob in {', '.join(args.files)}; give the jobs' manifests too")
        failed = True
    return 1 if failed else 0


def _crd(argv: list[str]) -> int:
    from mpjob.crd import DEFAULT_PATHS, crd_yaml

    parser = argparse.ArgumentParser(prog="mpjob crd", description="Print (or write) the generated CRD.")
    parser.add_argument("--write", action="store_true", help=f"write to {', '.join(map(str, DEFAULT_PATHS))}")
    parser.add_argument("--out", type=Path, action="append", help="write to this path instead (repeatable)")
    parser.add_argument(
        "--k8s-schemas",
        nargs="?",
        const="",
        type=str,
        metavar="OPENAPI_JSON",
        help="first regenerate the template's Kubernetes schemas (mpjob_contract/k8s/) from Kubernetes' "
        "OpenAPI v3 api__v1_openapi.json (default: the pinned version's, in the Go module cache)",
    )
    args = parser.parse_args(argv)
    if args.k8s_schemas is not None and _k8s_schemas(args.k8s_schemas) != 0:
        return 1
    text = crd_yaml()
    targets = args.out or (DEFAULT_PATHS if args.write else [])
    if not targets and args.k8s_schemas is None:
        sys.stdout.write(text)
    for target in targets:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        except OSError as exc:
            print(f"error: --out {target}: cannot write it ({exc.strerror or exc}: {exc.filename})")
            return 1
        print(f"wrote {target}")
    return 0


def _k8s_schemas(source: str) -> int:
    from mpjob import k8s_openapi
    from mpjob_contract import k8s

    path = Path(source) if source else k8s_openapi.module_cache_document(k8s.KUBERNETES_VERSION)
    if not path.is_file():
        print(f"{path}: not found; `bash tests/cluster/build.sh` downloads k8s.io/kubernetes into the Go module cache")
        return 1
    print(f"wrote {k8s_openapi.write(path, k8s.KUBERNETES_VERSION)}")
    k8s.template_schemas.cache_clear()
    return 0


def _operator(argv: list[str]) -> int:
    from mpjob.controller.main import main as operator_main

    return operator_main(argv)


def _run(argv: list[str]) -> int:
    from mpjob.localrun.cli import run_command

    return run_command(argv)


def _status(argv: list[str]) -> int:
    from mpjob.jobstatus import status_command

    return status_command(argv)


COMMANDS = {
    "run": (_run, "run a MixedPrecisionJob on this machine, no cluster"),
    "status": (_status, "sum up (and plot) a MixedPrecisionJob on a cluster, or a local run's folder"),
    "validate": (_validate, "check manifests against the same rules as the API server"),
    "crd": (_crd, "print the CustomResourceDefinition generated from the API models"),
    "operator": (_operator, "start the operator (kopf)"),
}


#: The exit code of a command the user interrupted (Ctrl-C), as a shell reports SIGINT.
INTERRUPTED = 130
#: The exit code of a command whose reader stopped reading (`| head`), as a shell reports SIGPIPE.
READER_GONE = 141


def _usage(argv: list[str]) -> int:
    if argv and argv[0] not in ("-h", "--help"):
        from mpjob_contract.spelling import did_you_mean  # the rule a misspelt manifest field is told by

        close = did_you_mean(argv[0], list(COMMANDS))
        print(f"error: unknown command {argv[0]!r}" + (f"; {close}" if close else ""))
    print("usage: mpjob {" + ",".join(COMMANDS) + "} ...\n")
    for name, (_, text) in COMMANDS.items():
        print(f"  {name:<9} {text}")
    return 0 if argv and argv[0] in ("-h", "--help") else 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        return _usage(argv)
    func, _ = COMMANDS[argv[0]]
    try:
        code = func(argv[1:])
        sys.stdout.flush()  # a closed pipe is found here, not in the interpreter's flush at exit
        return code
    except KeyboardInterrupt:  # before a command's own handling (`mpjob run`'s) or in one without
        print("interrupted")
        return INTERRUPTED
    except BrokenPipeError:  # `mpjob status DIR | head -3`: the rest of its lines go nowhere
        to_nowhere(sys.stdout)
        return READER_GONE


if __name__ == "__main__":
    sys.exit(main())
