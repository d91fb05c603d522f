"""`strata plan -m FILE --dry-run`: the VRAM plan of a model on your GPUs (NVML) or on cards
you don't have (`--gpu-mem 16GiB`), without allocating anything. Exit 0: accepted; 3: refused
(the refusal and its knobs are printed); 2: a bad flag, as every command; 1: the run failed (a
file, no GPU to read).

Imports stay light (no numba, no CUDA): the model's header is read, nothing else.
"""

from __future__ import annotations

import argparse
import sys

# 2 is every command's status for a bad flag (argparse's), so a refused plan, a plan's answer
# rather than a failure, has a status of its own
EXIT_ACCEPTED, EXIT_REFUSED = 0, 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    from strata.plan.devices import DRIVER_MODELS
    from strata.plan.knobs import add_engine_knobs

    p.add_argument("-m", "--model", required=True, metavar="FILE", help="GGUF model file")
    p.add_argument("--dry-run", action="store_true",
                   help="plan only (always the case: `strata plan` never allocates)")
    p.add_argument("--gpu-mem", metavar="SIZE[,SIZE...]",
                   help="plan for cards of these sizes instead of reading the GPUs (16GiB, 16G, "
                        "12000MiB, 1.5TiB); no GPU needed")
    p.add_argument("--driver-model", choices=DRIVER_MODELS,
                   help="driver model of the --gpu-mem cards (default: wddm on Windows, "
                        "else linux); only with --gpu-mem: NVML reads a present GPU's")
    p.add_argument("--device", type=int, metavar="N",
                   help="plan this one GPU alone when reading them through NVML (default: "
                        "every GPU, or --gpus; several GPUs split the layers); not with "
                        "--gpu-mem, whose sizes --gpus picks from, nor with --gpus")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_engine_knobs(p, draft=True)
    from strata.plan.split.knobs import add_split_knobs
    add_split_knobs(p)


def _check_device_flags(args: argparse.Namespace) -> None:
    """--device and --driver-model each describe one way of finding the GPUs: given with the
    other way, they would change nothing, so they are refused rather than ignored."""
    from strata.errors import UsageError

    if args.device is not None and args.gpu_mem is not None:
        raise UsageError(f"--device {args.device}: picks a GPU read through NVML, and --gpu-mem "
                         f"plans cards of its sizes instead (pick among them with --gpus, "
                         f"from 0; or drop --gpu-mem to plan GPU {args.device} as it is)")
    if args.device is not None and args.gpus is not None:
        raise UsageError(f"--device {args.device} and --gpus {args.gpus} both pick the GPUs to "
                         f"plan: give one (--gpus {args.device} plans GPU {args.device} alone)")
    if args.driver_model is not None and args.gpu_mem is None:
        raise UsageError(f"--driver-model {args.driver_model}: sets the driver of the --gpu-mem "
                         f"cards; a GPU read through NVML has its own (add --gpu-mem SIZE)")


def _devices(args: argparse.Namespace):
    from strata.plan.devices import parse_gpu_mem
    from strata.plan.options import OptionError
    from strata.plan.split.knobs import gpu_listing, pick_gpus

    if args.gpu_mem is not None:
        model = args.driver_model or ("wddm" if sys.platform.startswith("win") else "linux")
        return pick_gpus(parse_gpu_mem(args.gpu_mem, driver_model=model), args.gpus,
                         seen="--gpu-mem plans", hint="--gpus picks its sizes by position, "
                                                      "from 0"), []
    from strata.memory.probe import probe_devices

    found = probe_devices()
    if args.device is None:
        return pick_gpus(found, args.gpus), []
    chosen = [d for d in found if d.index == args.device]
    if not chosen:
        raise OptionError(f"--device {args.device}: NVML sees {gpu_listing(found)}")
    notes = []
    if len(found) > 1:
        notes.append(f"{len(found)} GPUs present; planning GPU {args.device} alone (--gpus or "
                     f"no --device splits the layers across them)")
    return chosen, notes


def run(args: argparse.Namespace) -> int:
    from strata.gguf import open_model
    from strata.plan import plan
    from strata.plan.knobs import load_profile, options_from_args
    from strata.plan.split.knobs import split_from_args

    _check_device_flags(args)
    options = options_from_args(args)
    split = split_from_args(args)
    mf = open_model(args.model)  # a wrong path is named before any question about GPUs
    devices, notes = _devices(args)
    shape = mf.shape
    profile = load_profile(mf.metadata, shape.n_layer, shape.n_expert, args.profile, mf.path)
    if len(devices) > 1:
        from strata.plan.split import plan_split
        result = plan_split(shape, devices, options, split, profile=profile)
    else:
        from strata.plan.split.knobs import refuse_split_flags
        refuse_split_flags(args, devices[0].index)
        result = plan(shape, devices, options, profile=profile)
    from strata.plan.host import probe_host_memory, store_shortfall
    host = store_shortfall(result.host_store_bytes, probe_host_memory())
    if host is not None:  # a note: the plan may be for another machine (--gpu-mem)
        notes = notes + [f"on this machine, {host}; the engine refuses to start here"]
    if args.json:
        import json
        d = result.to_dict()
        d["notes"] = notes + d["notes"]
        print(json.dumps(d, indent=2))
    else:
        from strata.plan.report import render
        render(result, model_name=mf.metadata.get("general.name") or args.model,
               extra_notes=notes)
    return EXIT_ACCEPTED if result.accepted else EXIT_REFUSED
