"""``collab.envs.minecraft.render`` (HouseBuild layer pictures, CoLLM §5.1 / Table 1) and
``notebooks/housebuild.ipynb`` executed top to bottom.

The notebook runs with nbclient on a ``python3`` kernel of this interpreter (a kernelspec written to a
temporary ``$JUPYTER_PATH``, with the repository's ``src`` on its ``PYTHONPATH``), in a temporary
folder, with the default settings (the shipped houses, the random ``tiny`` team, one short turn) and
``COLLAB_FIGURES`` a temporary folder.
"""

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import numpy as np  # noqa: E402

from collab.envs.minecraft import render  # noqa: E402
from collab.envs.minecraft.env import MinecraftEnv  # noqa: E402
from collab.envs.minecraft.scoring import measure  # noqa: E402
from collab.envs.minecraft.tasks import house_from_record  # noqa: E402
from tests.support.notebook_kernel import png_size, write_kernel  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PALETTE = ("air", "stone", "glass", "oak_planks")


def hand_made():
    """A 3 x 2 x 2 target and a build: layer 0 has 1 right, 1 missing, 1 wrong; layer 1 has 1 extra, 1 right."""
    target = np.zeros((3, 2, 2), dtype=np.uint8)
    built = np.zeros_like(target)
    target[0, 0, 0] = built[0, 0, 0] = 1  # right
    target[1, 0, 0] = 1  # missing
    target[2, 0, 1], built[2, 0, 1] = 2, 3  # wrong block
    built[0, 1, 1] = 3  # extra
    target[1, 1, 0] = built[1, 1, 0] = 2  # right
    return built, target


def test_counts_of_a_hand_made_build():
    built, target = hand_made()
    assert render.count(built, target) == render.Counts(correct=2, missing=1, wrong=1, extra=1)
    assert render.count(built, target, y=0) == render.Counts(correct=1, missing=1, wrong=1, extra=0)
    assert render.count(built, target, y=1) == render.Counts(correct=1, missing=0, wrong=0, extra=1)
    codes = render.classify(built, target)
    assert codes[1, 0, 0] == render.MISSING and codes[2, 0, 1] == render.WRONG and codes[0, 1, 1] == render.EXTRA
    c = render.count(built, target)
    assert (c.iou, c.coverage, c.redundancy) == pytest.approx((2 / 5, 2 / 4, 2 / 4))
    line = render.summary_line(built, target, hp=0.85)
    assert line.startswith("IoU 40.0%  HP 85%  coverage 0.50  redundancy 0.50")
    assert "2/4 blocks right, 1 missing, 1 wrong, 1 extra" in line
    assert render.count(target, target) == render.Counts(4, 0, 0, 0)
    assert render.count(np.zeros_like(target), np.zeros_like(target)).iou == 1.0
    with pytest.raises(Exception, match="same shape"):
        render.classify(built[:, :1], target)


def test_figure_has_a_panel_per_layer_and_grid():
    built, target = hand_made()
    fig = render.draw_layers(target, built, PALETTE, title="hand-made")
    labels = [ax.get_label() for ax in fig.axes]
    assert labels == ["target:y=0", "target:y=1", "built:y=0", "built:y=1"]
    titles = {ax.get_label(): ax.get_title() for ax in fig.axes}
    assert titles["built:y=0"] == "built  \u22121 \u00d71 +0" and titles["built:y=1"] == "built  \u22120 \u00d70 +1"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["stone", "glass", "oak_planks", "missing", "wrong block", "extra"]
    # Each mismatch is one marker on its build panel, at its (x, z).
    ax = next(a for a in fig.axes if a.get_label() == "built:y=0")
    points = sorted(tuple(p) for c in ax.collections for p in c.get_offsets().tolist())
    assert points == [(1.0, 0.0), (2.0, 1.0)]
    # Two builds and nine layers wrapping at four columns: 3 bands x 3 rows x 4 columns, 27 drawn.
    tall_t = np.ones((2, 9, 2), dtype=np.uint8)
    fig = render.draw_layers(
        tall_t, {"a": tall_t, "b": np.zeros_like(tall_t)}, PALETTE, columns=4, summaries={"a": "all right"}
    )
    assert len(fig.axes) == 36 and sum(ax.get_label().startswith("b:") for ax in fig.axes) == 9
    assert sum(ax.axison for ax in fig.axes) == 27
    assert "a: all right" in fig.get_suptitle()
    with pytest.raises(Exception, match="palette"):
        render.draw_layers(target, built, PALETTE[:2])


def test_hand_written_build_through_the_env():
    env = MinecraftEnv()
    task = env.tasks("eval")[0]
    house = house_from_record(task)
    exact = render.play_commands(env, task, render.target_commands(house))
    built, target = env.voxels(exact)
    assert render.count(built, target) == render.Counts(measure(house, house.target).correct, 0, 0, 0)
    state = render.play_commands(env, task, render.partial_build(house))
    built, target = env.voxels(state)
    c, m = render.count(built, target), measure(house, state.memory["world"])
    assert (c.wrong, c.extra) == (1, 1) and c.missing > 0
    assert (c.iou, c.coverage, c.redundancy) == pytest.approx((m.iou, m.coverage, m.redundancy))
    fig = render.draw_states(env, {"empty": env.reset(task), "half": state})
    assert len(fig.axes) == 3 * house.size[1]
    assert "half: IoU" in fig.get_suptitle() and "HP 100%" in fig.get_suptitle()


def test_housebuild_notebook(tmp_path, monkeypatch):
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", str(write_kernel(tmp_path)))
    figures = tmp_path / "figures"
    monkeypatch.setenv("COLLAB_FIGURES", str(figures))
    for name in (
        "COLLAB_HOUSEBUILD",
        "COLLAB_ADAPTERS",
        "COLLAB_MODEL",
        "COLLAB_TURNS",
        "COLLAB_MAX_NEW_TOKENS",
        "COLLAB_TASK",
        "COLLAB_ALGO",
    ):
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "work"
    work.mkdir()

    nb = nbformat.read(ROOT / "notebooks" / "housebuild.ipynb", as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert "collab_house_08" in text and "team: IoU" in text and "hand-written: IoU" in text
    assert "1 wrong, 1 extra" in text
    assert any("image/png" in o.get("data", {}) for o in outputs), "the figure is not displayed"
    png = figures / "housebuild_layers.png"
    assert png.stat().st_size > 10_000
    width, height = png_size(png)
    assert width > 800 and height > 500
    assert not list(work.iterdir()), "the notebook must not write into its working folder"
