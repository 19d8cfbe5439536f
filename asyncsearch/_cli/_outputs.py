"""Checks of the files a command is asked to write, made before anything is sent or written.

A command never writes over what it reads (``extract-many ids.txt -o ids.txt`` would read its own
lines back as ids forever; ``search --image a.png --parquet a.png`` would replace the image), and
an output that cannot be written is a usage error (exit 2) naming the path as the user gave it.
Files are compared by device and inode, so a symlink or a hard link to the input is caught too.
"""

from __future__ import annotations

import os
import stat
import sys

from ._run import EXIT_USAGE, CommandError

__all__ = ["STDIN", "STDOUT", "cannot_write", "check_not_input", "check_writable"]

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
