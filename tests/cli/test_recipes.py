"""A --flagfile recipe is the run's recipe: without data, one for another model than the
demo's is refused in one line (it would train on the digits), the demo's own runs as it is, and
the demo recipe is never laid on top of one (its --train_steps beside a recipe's --epochs
stopped the run). With --sidecar_eval a recipe's own evaluation interval is the side-car's."""

import pytest
from absl import flags

from tfgpu.cli import sidecar
from tfgpu.cli.flags import define_flags
from tfgpu.cli.train import make_config
from tfgpu.demo import DEMO_RECIPE
from tfgpu.errors import ConfigError

pytestmark = pytest.mark.fast


@pytest.fixture
def config_of(tmp_path, monkeypatch):
    """``config_of(*args)``: tfgpu-train's validated Config of ``args`` (the demo's data a
    stand-in folder), as the command makes it."""
    monkeypatch.setattr("tfgpu.demo.build_demo_dataset", lambda: str(tmp_path / "demo"))
    (tmp_path / "data").mkdir()

    def make(*args: str):
        argv = ["tfgpu", f"--model_dir={tmp_path / 'run'}", *args]
        fv = flags.FlagValues()
        define_flags(fv)
        sidecar.define_flags(fv)
        fv(argv)
        return make_config(fv, argv=argv)

    return make


def _recipe(tmp_path, *lines: str) -> str:
    path = tmp_path / "recipe.flags"
    path.write_text("# a recipe\n" + "\n".join(lines) + "\n")
    return f"--flagfile={path}"


def test_a_recipe_for_another_model_without_data_is_one_line(config_of):
    with pytest.raises(ConfigError) as raised:
        config_of("--flagfile=flags/resnet50_imagenet.flags")
    assert str(raised.value).startswith(
        "--flagfile=flags/resnet50_imagenet.flags is a recipe for --model=resnet50 but no "
        "dataset is given: add --data_dir=DIR"
    )


def test_the_demo_recipe_is_never_laid_on_a_recipe(config_of, tmp_path):
    epochs = _recipe(tmp_path, "--model=tiny_cnn", "--epochs=2", "--image_size=24")
    config = config_of(epochs)
    assert (config.train.epochs, config.train.train_steps, config.data.image_size) == (2, 0, 24)
    assert config.data.data_dir == str(tmp_path / "demo")  # the demo's data, the recipe's run
    demo = config_of("--flagfile=flags/demo_digits.flags")
    assert demo.flat() == config_of().flat()  # its file holds exactly the demo recipe
    assert config_of().train.train_steps == DEMO_RECIPE["train_steps"]


def test_a_recipe_with_its_data_runs_it(config_of, tmp_path):
    config = config_of("--flagfile=flags/resnet50_imagenet.flags", f"--data_dir={tmp_path}/data")
    assert config.model.name == "resnet50" and config.train.epochs == 90


def test_sidecar_eval_leaves_a_recipes_evaluations_to_the_side_car(config_of, tmp_path):
    data = f"--data_dir={tmp_path}/data"
    config = config_of("--flagfile=flags/resnet50_imagenet.flags", data, "--sidecar_eval")
    assert config.train.sidecar_eval and config.train.eval_every_steps == 0
    with pytest.raises(ConfigError, match="evaluation is the side-car's"):
        config_of(
            "--flagfile=flags/resnet50_imagenet.flags",
            data,
            "--sidecar_eval",
            "--eval_every_steps=100",
        )
