"""An ElfImage's file bytes go when the image goes, without a full collection:
pyelftools' ELFFile sits in reference cycles, and serve runs full collections only
every ten minutes (service/gcpauses.py), so bytes held by those cycles were RSS steps
of hundreds of MiB on a real GStreamer service (issue 58)."""

from __future__ import annotations

import gc
import sys

from refcntd.binary.elf import ElfImage


def test_the_file_bytes_go_with_the_image() -> None:
    enabled = gc.isenabled()
    gc.disable()
    try:
        image = ElfImage(sys.executable)
        assert image.sections and image.build_id is not None  # pyelftools' objects made
        stream = image._elf.stream
        assert not stream.closed and len(stream.getbuffer()) > 1 << 20
        del image
        assert stream.closed  # its buffer freed, though the ELFFile's cycles remain
    finally:
        if enabled:
            gc.enable()
