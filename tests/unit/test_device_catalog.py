"""The built-in device catalog reads the same data whichever YAML loader PyYAML has."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from ndplan.adapters.devices import catalog


def _data_files() -> list:
    return sorted(
        (e for e in resources.files(catalog.DATA_PACKAGE).iterdir() if e.name.endswith(".yaml")),
        key=lambda e: e.name,
    )


def test_there_are_builtin_device_files() -> None:
    assert len(_data_files()) >= 10


@pytest.mark.parametrize("entry", _data_files(), ids=lambda e: e.name)
def test_the_fast_loader_reads_what_the_safe_loader_reads(entry) -> None:
    text = entry.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=catalog._BUILTIN_LOADER) == yaml.safe_load(text)


def test_every_builtin_file_becomes_devices_once() -> None:
    devices = catalog.builtin_devices()
    ids = [d.id for d in devices]
    assert len(ids) == len(set(ids))
    expected = []
    for entry in _data_files():
        expected.extend(catalog.parse_devices(yaml.safe_load(entry.read_text("utf-8")), entry.name))
    assert devices == tuple(sorted(expected, key=lambda d: d.id))


def test_a_device_names_the_fitted_generation_that_prices_it() -> None:
    """A plugin's new part of a fitted generation says which fit prices it; without it
    (and not in the calibration's families table) it takes the default fit."""
    from ndplan.adapters.devices.calibration import load_calibration
    from ndplan.bootstrap import bootstrap

    calibration = load_calibration(None)
    h100 = bootstrap().devices.get("h100")
    assert calibration.families["h100-sxm"] == "hopper"
    new = h100.model_copy(update={"id": "h100-lab", "aliases": ()})
    assert not calibration.fits_device(new)
    assert calibration.for_device(new) == calibration.default
    named = new.model_copy(update={"calibration_family": "hopper"})
    assert calibration.fits_device(named)
    assert calibration.for_device(named) == calibration.for_device(h100)
    # The calibration's own table wins over what the device says.
    wrong = h100.model_copy(update={"calibration_family": "ampere"})
    assert calibration.for_device(wrong) == calibration.for_device(h100)
