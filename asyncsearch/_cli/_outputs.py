"""Checks of the files a command is asked to write, made before anything is sent or written.

No command writes over a file it did not make: ``check_output`` is the one rule every output
of every command goes through (``search --parquet``, ``extract-many -o`` and ``--parquet``,
``serve --write-ids``). An existing regular file is written to only when the command recognises
it as its own export, and then only in the ways it documents (resuming, ``--retry-failed``);
any other is refused (exit 2) and left as it is, unless ``--force`` says to replace it.
``-`` (stdout), a pipe, a terminal and ``/dev/null`` hold nothing to protect.

A command never writes over what it reads (``extract-many ids.txt -o ids.txt`` would read its own
lines back as ids forever; ``search --image a.png --parquet a.png`` would replace the image), and
an output that cannot be written is a usage error (exit 2) naming the path as the user gave it.
Files are compared by device and inode, so a symlink or a hard link to the input is caught too.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable

from ._run import EXIT_USAGE, CommandError

__all__ = [
    "STDIN",
    "STDOUT",
    "Recognise",
    "cannot_write",
    "check_not_input",
    "check_output",
    "check_writable",
]

#: The name ``-`` stands for stdin as an input and stdout as an output.
STDIN = STDOUT = "-"


def _identity(path: str, *, output: bool) -> tuple[int, int] | None:
    """Device and inode of the regular file at ``path`` (``-``: stdin or stdout), or None."""
    try:
        if path == "-":
            info = os.fstat(sys.stdout.fileno() if output else sys.stdin.fileno())
        else:
            info = os.stat(path)
    except (OSError, ValueError):  # no such file, or no such stream
        return None
    # Only regular files: stdin and stdout on the same /dev/null or terminal are not a loop.
    if not stat.S_ISREG(info.st_mode):
        return None
    return info.st_dev, info.st_ino


def _described(path: str, flag: str, *, output: bool) -> str:
    if path == "-":
        return f"{flag} - ({'stdout' if output else 'stdin'})"
    return f"{flag} {path}"


def check_not_input(input_path: str, input_flag: str, output_path: str, output_flag: str) -> None:
    """Refuse (exit 2) an output that is the input file, under any name."""
    source = _identity(input_path, output=False)
    if source is None or source != _identity(output_path, output=True):
        return
    raise CommandError(
        f"the output {_described(output_path, output_flag, output=True)} is the input "
        f"{_described(input_path, input_flag, output=False)} (the same file); "
        "choose another output file",
        EXIT_USAGE,
    )


def cannot_write(path: str, flag: str, reason: str) -> CommandError:
    """The usage error for an output that cannot be written, naming the path as given."""
    return CommandError(f"cannot open the output file {path} ({flag}): {reason}", EXIT_USAGE)


def check_writable(path: str, flag: str, *, renamed: bool = False) -> None:
    """Refuse (exit 2) an output path that cannot be written: a folder, a missing or read-only
    folder, or a read-only file. ``renamed``: the file is written aside and renamed into place,
    so its folder must be writable even when the file exists."""
    if os.path.isdir(path):
        raise cannot_write(path, flag, "it is a folder")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise cannot_write(path, flag, f"there is no folder {folder}")
    if os.path.exists(path) and not renamed:
        if not os.access(path, os.W_OK):
            raise cannot_write(path, flag, "the file is not writable")
    elif not os.access(folder, os.W_OK | os.X_OK):
        raise cannot_write(path, flag, f"the folder {folder} is not writable")


#: Reads an existing output file and says why it is NOT this command's own export (None: it is).
Recognise = Callable[[str], str | None]


def check_output(
    path: str,
    flag: str,
    *,
    force: bool,
    renamed: bool = False,
    export: str | None = None,
    recognise: Recognise | None = None,
) -> bool:
    """The rule for every output of every command; True when ``path`` is an export to resume.

    ``export`` names what the command resumes ("a JSON Lines export of extract-many") and
    ``recognise`` tells it from anything else; a command that resumes nothing gives neither,
    and then every existing regular file is refused. ``force``: the file is replaced instead
    (the caller starts anew; False is returned). ``renamed``: the output is written aside and
    renamed over ``path``, so it must be a regular file or nothing (a rename over a pipe or
    ``/dev/null`` would replace the pipe or the device itself). Raises ``CommandError`` (exit 2).
    """
    if path == STDOUT:
        return False
    check_writable(path, flag, renamed=renamed)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise cannot_write(path, flag, exc.strerror or str(exc)) from None
    if not stat.S_ISREG(info.st_mode):
        if renamed:
            raise cannot_write(
                path,
                flag,
                "it is not a regular file (a pipe or a device); the file is written aside and "
                "renamed into place, which would replace it: choose a file name",
            )
        return False
    if force:
        return False
    if recognise is None or export is None:
        why = "it exists, and this command writes a new file: it resumes none"
    else:
        reason = recognise(path)
        if reason is None:
            return True
        why = f"it exists and is not {export}: {reason}"
    raise CommandError(
        f"{path} ({flag}): {why}; it is left as it is. Choose another file, or add --force to "
        "replace it",
        EXIT_USAGE,
    )
