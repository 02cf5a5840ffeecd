"""Output paths: refuse a missing folder in one line before any work is done."""

import os

from tcert.api.errors import BadInputError


def writable(path) -> str:
    """`path` as a string, or BadInputError when its folder does not exist or it names a folder."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise BadInputError(f"cannot write {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise BadInputError(f"cannot write {path}: it is a folder")
    return path


def write_text(path, text: str) -> str:
    """Write `text` to `path` (checked by `writable`) atomically; an OS refusal is one BadInputError line."""
    path = writable(path)
    temporary = f"{path}.tcert-partial"
    try:   # written beside, then renamed: an interrupted write (--timeout, Ctrl-C) never leaves half a file
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, path)
    except OSError as e:
        raise BadInputError(f"cannot write {path}: {e.strerror}") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path
