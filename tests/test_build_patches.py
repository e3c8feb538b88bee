"""The patch series: applied in order, each checked first; one that does not fit stops the build."""

from __future__ import annotations

import pytest

from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.core.paths import sources_dir
from bonsai_launch.llamacpp.builds.patches import apply_series, load_series, series_hash, touching
from bonsai_launch.llamacpp.builds.source import prepare_pin
from bonsai_launch.llamacpp.builds.webui import UI_PATHS
from build_helpers import bad_patch, fake_tree, file_index, help_patch, make_sdist, use_index, write_pin


def test_series_is_ordered_and_hashed(tmp_path):
    assert load_series(tmp_path / "none") == () and series_hash(()) == ""
    folder = tmp_path / "patches"
    help_patch(folder, "0002-b.patch", "draft-b")
    help_patch(folder, "0001-a.patch", "draft-a")
    (folder / "README").write_text("not a patch")
    series = load_series(folder)
    assert [p.name for p in series] == ["0001-a.patch", "0002-b.patch"]
    assert len(series_hash(series)) == 64


def test_only_patches_to_the_page_decide_its_build(tmp_path):
    """A kernel patch changes the series (and the server's build key), not the chat page's
    assets: the page's key takes only the patches that touch its sources."""
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "0001-kernel.patch").write_text(
        "why\n\ndiff --git a/ggml/src/x.c b/ggml/src/x.c\n--- a/ggml/src/x.c\n+++ b/ggml/src/x.c\n@@ -1 +1 @@\n-a\n+b\n"
    )
    (folder / "0002-page.patch").write_text(
        "why\n\ndiff --git a/tools/ui/src/app.ts b/tools/ui/src/app.ts\n--- a/tools/ui/src/app.ts\n"
        "+++ b/tools/ui/src/app.ts\n@@ -1 +1 @@\n-a\n+b\n"
    )
    series = load_series(folder)
    assert [p.name for p in touching(series, UI_PATHS)] == ["0002-page.patch"]
    # the vendored series: no patch of ours touches the page today
    assert touching(load_series(), UI_PATHS) == ()


def test_vendored_series_is_well_formed():
    # Each vendored patch says why, then diffs paths relative to the llama.cpp tree (-p1).
    series = load_series()
    assert [p.name for p in series] == sorted(p.name for p in series)
    for patch in series:
        text = patch.path.read_text()
        why, _, diff = text.partition("\n--- a/")
        assert why.strip(), f"{patch.name} has no description"
        assert diff and "\n+++ b/" in "\n--- a/" + diff and "\n@@ " in diff, f"{patch.name} is not a -p1 unified diff"


def test_patch_applies(tmp_path):
    tree = fake_tree(tmp_path / "tree")
    apply_series(tree, load_series(help_patch(tmp_path / "p").parent))
    assert "draft-patched" in (tree / "server.c").read_text()


def test_patch_that_does_not_apply_is_named(tmp_path):
    tree = fake_tree(tmp_path / "tree")
    bad_patch(tmp_path / "p")
    before = (tree / "server.c").read_text()
    with pytest.raises(ActionFailed, match=r"0002-does-not-apply\.patch does not apply cleanly"):
        apply_series(tree, load_series(tmp_path / "p"))
    assert (tree / "server.c").read_text() == before


def test_pinned_source_with_a_bad_patch_leaves_no_tree(tmp_path, monkeypatch):
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    pin = write_pin(tmp_path / "vendor", archive, sha)
    help_patch(tmp_path / "p")
    bad_patch(tmp_path / "p")
    with pytest.raises(ActionFailed, match=r"0002-does-not-apply\.patch"):
        prepare_pin(pin.default, load_series(tmp_path / "p"))
    left = {p.name for p in sources_dir().iterdir()} - {".lock", "downloads"}
    assert left == set(), f"half-patched trees left behind: {left}"


def test_pinned_source_with_patches_gets_its_own_folder(tmp_path, monkeypatch):
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    pin = write_pin(tmp_path / "vendor", archive, sha)
    plain = prepare_pin(pin.default, ())
    patched = prepare_pin(pin.default, load_series(help_patch(tmp_path / "p").parent))
    assert plain.path != patched.path and patched.path.parent.name.startswith("fake-llama-bin-1.0-p")
    assert "draft-patched" in (patched.path / "server.c").read_text()
    assert "draft-patched" not in (plain.path / "server.c").read_text()
    assert patched.patches == ("0001-add-type.patch",)


def test_0007_guards_the_vulkan_layer_settings_block():
    """Debian 12's Vulkan headers (1.3.239) have no VK_EXT_layer_settings; the pin's ggml-vulkan
    uses it unconditionally. The vulkan lane builds and runs the result; this checks the patch's
    shape: every line it leaves using the extension's types sits under the guard, with an #else."""
    patch = next(p for p in load_series() if p.name.startswith("0007-"))
    lines = patch.path.read_text().partition("\n--- a/")[2].splitlines()
    assert "+++ b/ggml/src/ggml-vulkan/ggml-vulkan.cpp" in lines
    hunk = [ln[1:] for ln in lines if ln[:1] in (" ", "+")]
    start, other, end = (hunk.index(x) for x in ("#if defined(VK_EXT_layer_settings)", "#else", "#endif"))
    uses = [i for i, ln in enumerate(hunk) if "LayerSetting" in ln]
    assert uses and all(start < i < other for i in uses), "a VK_EXT_layer_settings use outside the guard"
    assert "vk::InstanceCreateInfo instance_create_info(" in "\n".join(hunk[other:end])
