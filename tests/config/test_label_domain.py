"""--label_offset and --num_classes outside their documented domain are one line at
validation (-2 used to be taken as -1, "from dataset_info.json", without a word)."""

import pytest

from tfgpu.config import config_from, validate
from tfgpu.errors import ConfigError

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    "setting, line",
    [
        (
            dict(label_offset=-2),
            "--label_offset=-2: expected 0 or more (-1: from dataset_info.json)",
        ),
        (dict(num_classes=-5), "--num_classes=-5: expected 0 or more (0: from dataset_info.json)"),
    ],
)
def test_a_value_outside_the_domain_is_one_line(setting, line):
    with pytest.raises(ConfigError) as raised:
        validate(config_from(synthetic_data=True, **setting))
    assert str(raised.value) == line


@pytest.mark.parametrize("offset", [-1, 0, 1, 3])
def test_the_documented_values_validate(offset):
    assert (
        validate(config_from(synthetic_data=True, label_offset=offset)).data.label_offset == offset
    )
