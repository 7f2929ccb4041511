"""Helpers shared by test folders (``tests/`` is on pytest's path: setup.cfg)."""
import h5py


def corrupt_chunk(path, index):
    """Overwrite the stored bytes of chunk ``index`` of ``images`` (one image per chunk) with garbage."""
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info(index)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * info.size)
