"""Packaging: the install is one top-level package, and setup.cfg lists every subpackage."""

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def declared():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    packages = config["options"]["packages"].split()
    package_dir = {}
    for line in config["options"]["package_dir"].strip().splitlines():
        name, _, folder = line.partition("=")
        package_dir[name.strip()] = folder.strip()
    return packages, package_dir


def on_disk(package_dir):
    """Every package of the installed tree, as the folders on disk make it."""
    roots = {"stratify": ROOT / "stratify"} | {
        name: ROOT / folder for name, folder in package_dir.items()
    }
    found = set()
    for name, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            parts = init.parent.relative_to(folder).parts
            found.add(".".join((name, *parts)))
    return found


def test_setup_cfg_lists_every_package_folder():
    packages, package_dir = declared()
    assert set(packages) == on_disk(package_dir)


def test_only_stratify_is_installed_at_the_top_level():
    packages, package_dir = declared()
    assert {name.split(".")[0] for name in packages} == {"stratify"}
    assert package_dir == {"stratify.baselines": "baselines", "stratify.cli": "cli"}


def test_console_script_points_into_the_package():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    scripts = config["options.entry_points"]["console_scripts"].strip()
    assert scripts == "stratify = stratify.cli.main:main"
