"""packfs demo: generate a small image dataset, pack it, read it all back.

Run with ``make demo``.  It writes ./demo-data/ (the source tree and the archive),
packs the tree, reads every file back through PackedFolder, decodes every JPEG with
``cv2.imdecode`` and checks it against ``cv2.imread`` of the original, mounts the archive
with ``packfs mount``, checks every image read through the mount with ``cv2.imread``,
and prints read rates for the plain directory, PackedFolder and the mount side by side.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np

import packfs

ROOT = Path("demo-data")
SOURCE = ROOT / "dataset"
ARCHIVE = ROOT / "dataset.ffr"
CLASSES = ["cat", "dog", "bird", "fish"]
IMAGES_PER_CLASS = 250


def make_dataset() -> None:
    """An ImageNet-like tree: train/ and val/ class folders of JPEGs, plus text and .npy."""
    if SOURCE.exists():
        shutil.rmtree(SOURCE)
    rng = np.random.default_rng(0)
    for split, count in (("train", IMAGES_PER_CLASS), ("val", IMAGES_PER_CLASS // 5)):
        for label, name in enumerate(CLASSES):
            folder = SOURCE / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                image = np.zeros((96, 128, 3), np.uint8)
                image[:] = rng.integers(0, 255, 3, dtype=np.uint8)
                centre = tuple(int(v) for v in rng.integers(16, 80, 2))
                colour = tuple(int(v) for v in rng.integers(0, 255, 3))
                cv2.circle(image, centre, 10 + label * 5, colour, -1)
                cv2.putText(image, f"{name}{i}", (4, 90), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 255))
                cv2.imwrite(str(folder / f"{i:05d}.jpg"), image)
    (SOURCE / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    (SOURCE / "README.txt").write_text("A generated sample dataset for the packfs demo.\n")
    np.save(SOURCE / "features.npy", rng.standard_normal((256, 64)).astype(np.float32))
    (SOURCE / "meta").mkdir()
    (SOURCE / "meta" / "split.json").write_text(json.dumps({"train": 0.8, "val": 0.2}))
    (SOURCE / "empty_dir").mkdir()


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>10,.0f} files/s"


def demo_mount(images: list[str], timed) -> tuple[float, float, float] | None:
    """Mount the archive, check every image read through it, time it, unmount."""
    from packfs.errors import MountError
    from packfs.mount import check_fuse

    try:
        check_fuse()
    except MountError as error:
        print(f"skipping the mount part: {error}")
        return None
    mountpoint = ROOT / "mnt"
    mountpoint.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "packfs", "mount", str(ARCHIVE), str(mountpoint)], check=True)
    try:
        for path in images:
            if not np.array_equal(cv2.imread(str(mountpoint / path)), cv2.imread(str(SOURCE / path))):
                raise SystemExit(f"PIXELS DIFFER through the mount: {path}")
        print(f"cv2.imread of all {len(images)} images through {mountpoint}/ equals the originals")

        def plain_read(path: str) -> bytes:
            with open(mountpoint / path, "rb") as f:
                return f.read()

        def unbuffered_read(path: str) -> bytes:
            # No isatty() ioctl, the one request a warm buffered open() still makes.
            with open(mountpoint / path, "rb", buffering=0) as f:
                return f.read()

        return timed(plain_read), timed(unbuffered_read), timed(lambda p: cv2.imread(str(mountpoint / p)))
    finally:
        subprocess.run([sys.executable, "-m", "packfs", "unmount", str(mountpoint)], check=True)
        print(f"unmounted {mountpoint}")


def main() -> int:
    ROOT.mkdir(exist_ok=True)
    print(f"packfs {packfs.__version__} demo")
    started = time.perf_counter()
    make_dataset()
    paths = sorted(str(p.relative_to(SOURCE)) for p in SOURCE.rglob("*") if p.is_file())
    images = [p for p in paths if p.endswith(".jpg")]
    print(f"generated {len(paths)} files ({len(images)} JPEGs) in {time.perf_counter() - started:.1f} s")

    stats = packfs.pack_folder(SOURCE, ARCHIVE, force=True)
    print(f"packed into {ARCHIVE}: {stats.files} files, {stats.dirs} dirs, "
          f"{stats.archive_bytes / 1e6:.1f} MB in {stats.seconds:.2f} s "
          f"({stats.files / stats.seconds:,.0f} files/s)")

    with packfs.PackedFolder(ARCHIVE) as folder:
        # Every file, byte for byte.
        for path in paths:
            if folder.read(path) != (SOURCE / path).read_bytes():
                print(f"MISMATCH: {path}", file=sys.stderr)
                return 1
        # Every image decodes to the same pixels as the original.
        for path in images:
            decoded = cv2.imdecode(np.frombuffer(folder.read_view(path), np.uint8), cv2.IMREAD_COLOR)
            if not np.array_equal(decoded, cv2.imread(str(SOURCE / path))):
                print(f"PIXELS DIFFER: {path}", file=sys.stderr)
                return 1
        features = np.load(folder.open("features.npy"))
        assert np.array_equal(features, np.load(SOURCE / "features.npy"))
        print(f"read back all {len(paths)} files byte for byte; decoded {len(images)} images; "
              f"features.npy {features.shape} loads from folder.open()")
        report = folder.verify()
        print(f"verify: {'OK' if report.ok else 'DAMAGED'} ({report.records_checked} records)")

        # Warm read rates, side by side in this run.
        def timed(read) -> float:
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                for path in images:
                    read(path)
                best = min(best, time.perf_counter() - start)
            return best

        def plain(path: str) -> bytes:
            with open(SOURCE / path, "rb") as f:
                return f.read()

        t_plain = timed(plain)
        t_read = timed(folder.read)
        t_view = timed(folder.read_view)
        t_decode_packed = timed(lambda p: cv2.imdecode(np.frombuffer(folder.read_view(p), np.uint8), cv2.IMREAD_COLOR))
        t_decode_plain = timed(lambda p: cv2.imread(str(SOURCE / p)))
    mount_rates = demo_mount(images, timed)
    print()
    print(f"warm reads of {len(images)} JPEGs (best of 3):")
    print(f"  open().read()             {rate(len(images), t_plain)}   1.00x")
    print(f"  PackedFolder.read         {rate(len(images), t_read)}   {t_plain / t_read:.2f}x")
    print(f"  PackedFolder.read_view    {rate(len(images), t_view)}   {t_plain / t_view:.2f}x")
    print(f"  cv2.imread (plain)        {rate(len(images), t_decode_plain)}   1.00x")
    print(f"  cv2.imdecode (packfs)     {rate(len(images), t_decode_packed)}   {t_decode_plain / t_decode_packed:.2f}x")
    if mount_rates:
        t_mount_read, t_mount_unbuffered, t_mount_imread = mount_rates
        print(f"  open().read() via mount   {rate(len(images), t_mount_read)}   {t_plain / t_mount_read:.2f}x")
        print(f"  the same, buffering=0     {rate(len(images), t_mount_unbuffered)}   "
              f"{t_plain / t_mount_unbuffered:.2f}x")
        print(f"  cv2.imread via mount      {rate(len(images), t_mount_imread)}   {t_decode_plain / t_mount_imread:.2f}x")
        print("  (a buffered open() through any FUSE mount costs one round trip to the daemon, its\n"
              "   isatty() ioctl, which dominates a read of these 2 KB JPEGs; buffering=0 skips it.\n"
              "   On 79 KB JPEGs: 0.43x buffered, 0.98x unbuffered, imread 1.09x: docs/performance.md)")
    print(f"\ndemo finished in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
