"""The ImageNet recipe (docs/pytorch.md, linked from the README), run as written on a
miniature ILSVRC2012 layout."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

import packfs
from tests.conftest import REPO, require_extra

require_extra("torch", "torch")
cv2 = require_extra("cv2", "test")


def recipe(name: str) -> str:
    page = (REPO / "docs" / "pytorch.md").read_text()
    match = re.search(rf"<!-- recipe: {re.escape(name)} -->\n```python\n(.*?)```", page, re.DOTALL)
    assert match, f"docs/pytorch.md has no recipe {name}"
    return match.group(1)


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 1_600_000_000
    tar.addfile(info, io.BytesIO(data))


def jpeg(value: int) -> bytes:
    return cv2.imencode(".jpg", np.full((8, 8, 3), value, np.uint8))[1].tobytes()


def test_the_imagenet_recipe_packs_nested_class_tars_for_packed_image_folder(tmp_path: Path) -> None:
    from packfs.torch import PackedDataset, PackedImageFolder

    classes = ["n01440764", "n01443537", "n15075141"]
    with tarfile.open(tmp_path / "ILSVRC2012_img_train.tar", "w") as outer:
        for k, name in enumerate(classes):
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as inner:
                for i in range(3):
                    add_member(inner, f"{name}_{i}.JPEG", jpeg(40 * k + i))
            add_member(outer, f"{name}.tar", buffer.getvalue())
    with tarfile.open(tmp_path / "ILSVRC2012_img_val.tar", "w") as val:
        for i in (2, 1, 3):
            add_member(val, f"ILSVRC2012_val_{i:08d}.JPEG", jpeg(i))
    (tmp_path / "pack_imagenet_train.py").write_text(recipe("pack_imagenet_train.py"))

    subprocess.run([sys.executable, "pack_imagenet_train.py", "ILSVRC2012_img_train.tar", "imagenet-train.ffr"],
                   cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "-m", "packfs", "pack", "-q", "ILSVRC2012_img_val.tar", "imagenet-val.ffr"],
                   cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "-m", "packfs", "verify", "-q", "imagenet-train.ffr"], cwd=tmp_path, check=True)

    train = PackedImageFolder(tmp_path / "imagenet-train.ffr", root="train", loader="cv2")
    assert train.classes == classes and len(train) == 9
    assert train.samples[4] == ("train/n01443537/n01443537_1.JPEG", 1)
    image, target = train[4]
    assert target == 1 and image.shape == (8, 8, 3) and abs(int(image[0, 0, 0]) - 41) <= 2
    with packfs.PackedFolder(tmp_path / "imagenet-train.ffr") as folder:
        assert folder.stat("train/n01440764/n01440764_0.JPEG").permissions == 0o644
    val = PackedDataset(tmp_path / "imagenet-val.ffr", "*.JPEG")
    assert [val.path(i) for i in range(3)] == [f"ILSVRC2012_val_{i:08d}.JPEG" for i in (1, 2, 3)]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_and_docs_link_only_to_files_and_headings_that_exist() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    readme = pages[0].read_text()
    assert "make demo" in readme and "make test" in readme
    for page in pages[1:]:
        assert f"docs/{page.name}" in readme, f"the README does not link {page.name}"
    for page in pages:
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name} links to {target}, which does not exist"
            if anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
                assert anchor in {slug(h) for h in headings}, f"{page.name} links to {target}: no such heading"
