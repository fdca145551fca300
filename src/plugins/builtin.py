"""The built-in plugin: registers the default adapters through the public hooks.

Every implementation is ``trylast`` so a third-party plugin is asked first, and
replaces a built-in only by passing ``replace=True``.
"""

from __future__ import annotations

from .hookspecs import hookimpl


@hookimpl(trylast=True)
def ndplan_register_devices(registry):
    from ndplan.adapters.devices.catalog import builtin_devices

    for device in builtin_devices():
        registry.add(device.id, device, aliases=device.aliases)


@hookimpl(trylast=True)
def ndplan_register_presets(registry):
    from ndplan.adapters.readers.catalog import builtin_presets, preset_loader

    for preset_id, data in builtin_presets().items():
        meta = data.get("_ndplan", {})
        aliases = tuple(meta.get("aliases", ())) + (
            (meta["display_name"],) if "display_name" in meta else ()
        )
        registry.add(preset_id, preset_loader(preset_id), aliases=aliases)


@hookimpl(trylast=True)
def ndplan_register_model_readers(registry):
    from ndplan.adapters.readers.hf import HFConfigReader

    registry.add("huggingface", HFConfigReader())


@hookimpl(trylast=True)
def ndplan_register_memory_models(registry):
    from ndplan.core.memory import MegatronMemoryModel, NdplanMemoryModel

    registry.add("ndplan", NdplanMemoryModel)
    registry.add("megatron", MegatronMemoryModel)


@hookimpl(trylast=True)
def ndplan_register_cost_models(registry):
    from ndplan.core.performance import NdplanCostModel

    registry.add("ndplan", NdplanCostModel)


@hookimpl(trylast=True)
def ndplan_register_knapsack_solvers(registry):
    from ndplan.core.kernels.knapsack import DefaultKnapsackSolver

    registry.add("dp", DefaultKnapsackSolver)


@hookimpl(trylast=True)
def ndplan_register_executors(registry):
    import importlib.util

    from ndplan.adapters.executors.serial import SerialExecutor

    registry.add("serial", lambda jobs=1, options=None: SerialExecutor())
    registry.add("pool", _pool)
    # Ray is an optional extra; finding it is cheap, importing it is not (it is
    # imported when a ray executor is opened).
    if importlib.util.find_spec("ray") is not None:
        registry.add("ray", _ray)


def _pool(jobs=2, options=None):
    from ndplan.adapters.executors.pool import PoolExecutor

    return PoolExecutor(jobs, plugins=(options or {}).get("plugins") or ())


def _ray(jobs=2, options=None):
    from ndplan.adapters.executors.ray_executor import RayExecutor

    return RayExecutor(jobs, address=(options or {}).get("ray_address"))


@hookimpl(trylast=True)
def ndplan_register_debug_sinks(registry):
    from ndplan.adapters.sinks.files import CsvSink, JsonLinesSink, NullSink
    from ndplan.adapters.sinks.lines import StderrLinesSink

    registry.add("csv", CsvSink)
    registry.add("jsonl", JsonLinesSink)
    registry.add("null", NullSink)
    registry.add("stderr", StderrLinesSink)


@hookimpl(trylast=True)
def ndplan_register_exporters(registry):
    from ndplan.adapters.exporters.deepspeed import DeepSpeedExporter
    from ndplan.adapters.exporters.megatron import MegatronExporter
    from ndplan.adapters.exporters.mindformers import MindFormersExporter
    from ndplan.adapters.exporters.ndplan import NdplanExporter
    from ndplan.adapters.exporters.torchtitan import TorchtitanExporter

    registry.add("megatron", MegatronExporter())
    registry.add("torchtitan", TorchtitanExporter())
    registry.add("mindformers", MindFormersExporter())
    registry.add("deepspeed", DeepSpeedExporter())
    registry.add("ndplan", NdplanExporter())
