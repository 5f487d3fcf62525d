"""What the type checker knows of packfs._sigbus (packfs/_sigbus.c): the guard that
lets a process survive a SIGBUS in a map of a file truncated under it."""

import mmap

UNCHANGED: int
FAULTED: int
REPLACED: int
STAT_FAILED: int
CAPACITY: int

def register(buffer: mmap.mmap, fd: int) -> int: ...
def unregister(slot: int) -> None: ...
def check(slot: int) -> int: ...
def faults(slot: int) -> int: ...
