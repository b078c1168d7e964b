"""``onnxq``: quantize ONNX models to INT8 Q/DQ, check them against a backend, explain placement.

Exit codes (:data:`EXIT_CODES`): 0 success; 1 a check found violations, or an accuracy target
was missed; 2 a user error (one line on stderr, no traceback, nothing written); 3 an internal
error, a bug in onnxq (the traceback, then one line asking for a report); 130 interrupted.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Sequence

from onnxq.cli.flags import refuse_moved
from onnxq.cli.parser import build_parser
from onnxq.errors import (
    REPORT_REQUEST,
    AccuracyError,
    BackendConstraintError,
    InternalError,
    OnnxqError,
)

EXIT_OK = 0
EXIT_FAILED = 1  # the run worked and its result falls short: violations, a missed target
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 3
EXIT_INTERRUPTED = 130
# what the CLI exits with for each kind of error (the first class that matches)
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (AccuracyError, EXIT_FAILED),
    (OnnxqError, EXIT_USER_ERROR),
    (InternalError, EXIT_INTERNAL_ERROR),
    (KeyboardInterrupt, EXIT_INTERRUPTED),
    (Exception, EXIT_INTERNAL_ERROR),  # any other exception is a bug in onnxq too
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnxq`` console script."""
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        refuse_moved(words)  # a flag that moved to --set: say where, before argparse's error
    except OnnxqError as exc:
        print(f"onnxq: error: {one_line(exc)}", file=sys.stderr)
        return exit_code(exc)
    args = build_parser().parse_args(words)
    # Ctrl-C and SIGTERM become KeyboardInterrupt, held off while a scratch folder is made or
    # removed (onnxq.ir.scratch): an interrupted run leaves nothing behind
    from onnxq.ir.scratch import interrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        if args.command == "quantize":
            from onnxq.cli.quantize import quantize_command

            return quantize_command(args)
        from onnxq.cli import tools as cli_tools

        command = {
            "check": cli_tools.check_command,
            "inspect": cli_tools.inspect_command,
            "analyze": cli_tools.analyze_command,
            "tune-cpu": cli_tools.tune_cpu_command,
            "explain": cli_tools.explain_command,
        }
        return command[args.command](args)
    except OnnxqError as exc:
        print(f"onnxq: error: {one_line(exc)}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        print("onnxq: interrupted; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # a reader that stopped early (`onnxq explain M | head`)
        raise
    except Exception as exc:  # InternalError, or any other bug: the traceback helps the report
        traceback.print_exc(file=sys.stderr)
        what = (
            one_line(exc)
            if isinstance(exc, InternalError)
            else (f"{type(exc).__name__}: {one_line(exc)}; {REPORT_REQUEST}")
        )
        print(f"onnxq: internal error: {what}", file=sys.stderr)
        return exit_code(exc)


def exit_code(exc: BaseException) -> int:
    """The exit code for ``exc`` (:data:`EXIT_CODES`): 1 for a backend constraint error that
    lists violations, as for a failed check."""
    if isinstance(exc, BackendConstraintError) and exc.violations:
        return EXIT_FAILED
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), EXIT_INTERNAL_ERROR)


def one_line(exc: BaseException) -> str:
    """``exc``'s message and the notes added to it (``add_note``), on one line."""
    text = "; ".join([str(exc), *getattr(exc, "__notes__", ())])
    return " ".join(text.split())


def main_exit() -> None:
    """Console-script wrapper: exit with :func:`main`'s code; output piped into a reader that
    stops early (``onnxq explain M | head``) ends quietly, as other command-line tools do."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        code = 141  # 128 + SIGPIPE, what a shell reports for such a writer
    sys.exit(code)


if __name__ == "__main__":
    main_exit()
