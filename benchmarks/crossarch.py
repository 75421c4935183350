"""Cross-architecture numerics: does an aarch64 DPU build the samples an x86-64 host builds, bit for bit?

    python benchmarks/crossarch.py [--cpus neoverse-n1,cortex-a72] [--samples 64] [--quick]
    python benchmarks/crossarch.py --side OUT.pkl --inputs IN.npz [--reference REF.pkl] [--dump REQ.pkl]

Seven torchvision pipelines (`PIPELINES`, one definition that both sides run): CIFAR's RandomCrop +
flip; PIL decode + RandomResizedCrop + flip; torchvision-v2 `decode_jpeg` + RandomResizedCrop + flip;
PIL decode + Resize + CenterCrop; the same in v2 on uint8 tensors; ColorJitter on PIL images; the same
ColorJitter on float tensors (each then ToTensor / ToDtype + Normalize). Inputs: crops of
scikit-learn's two sample photographs (synthetic images where scikit-learn is missing), made once on
the x86 side and read by every side from one .npz: 500x375 JPEGs (PIL, quality 90) and 32x32 RGB arrays.

Each side (`--side`, any interpreter) runs with one torch thread and fingerprints samples 0..N-1 of
epoch 0 under seed 0 exactly as the numerics check does (`common.data.numerics.fingerprint`: per-sample
seeds, a digest of every step's output): the whole transform (what the float wire sends) and, where
`plan_split(ds, Wire.AUTO)` splits it, the DPU's part (`dpu_view`: the integer steps and `ToWire`, what
a DPU rank sends under the default `--wire auto`). The sides:
- x86 AVX2: the x86 venv at torch's own kernel level (the reference every other side is compared with);
- x86 default: the x86 venv with `ATEN_CPU_CAPABILITY=default` (torch's scalar kernels);
- aarch64 N1 / A72: the aarch64 venv (`scripts/aarch64.sh python`, qemu-user) with qemu's CPU
  `neoverse-n1` (~ BlueField-3's A78) and `cortex-a72` (BlueField-2's core).
Per pipeline and wire: samples identical out of N (`compare`), and for the first differing sample its
first differing step and by how much (`Magnitude` of `step_output` on both sides; the reference side's
outputs come from a second, `--dump`, pass). Also each side's wall time (interpreter start and imports
included: 25-50 s for torch under qemu) and its fingerprinting time. The aarch64 venv runs torch 2.9.1 /
torchvision 0.24.1 (PyPI's aarch64 torch 2.14.1 is a CUDA build), so a difference there may be the
architecture or the version: the x86 default row isolates the kernel level at one version.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

T_START = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from benchmarks.harness import RESULTS, ROOT, Section, machine, table, write_json  # noqa: E402
from dpuoffload.common.data.numerics import Magnitude, Platform, compare, fingerprint, step_output  # noqa: E402

SEED = 0
SAMPLES = 64
JPEG_SIZE = (500, 375)  # (width, height): ImageNet's typical photograph
JPEG_QUALITY = 90
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CPUS = ("neoverse-n1", "cortex-a72")
CPU_LABEL = {"neoverse-n1": "aarch64 N1", "cortex-a72": "aarch64 A72"}
REFERENCE = "x86 AVX2"
X86_DEFAULT = "x86 default"
WIRES = ("float", "uint8")


# ------------------------------------------------------------------------------------ pipelines
class DecodePIL:
    """JPEG bytes -> PIL RGB image (what an ImageFolder's loader does)."""

    def __call__(self, data: bytes) -> Image.Image:
        with Image.open(io.BytesIO(data)) as im:
            return im.convert("RGB")

    def __repr__(self) -> str:
        return "DecodePIL()"


class DecodeJPEG:
    """JPEG bytes -> uint8 CHW tensor through `torchvision.io.decode_jpeg` (the v2 pipelines' decode)."""

    def __call__(self, data: bytes) -> Any:
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)

    def __repr__(self) -> str:
        return "DecodeJPEG()"


def _cifar() -> Any:
    from torchvision import transforms as T

    return T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(CIFAR_MEAN, CIFAR_STD)])


def _pil_rrc() -> Any:
    from torchvision import transforms as T

    return T.Compose([DecodePIL(), T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _v2_rrc() -> Any:
    import torch
    from torchvision.transforms import v2

    return v2.Compose([DecodeJPEG(), v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _pil_resize() -> Any:
    from torchvision import transforms as T

    return T.Compose([DecodePIL(), T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _v2_resize() -> Any:
    import torch
    from torchvision.transforms import v2

    return v2.Compose([DecodeJPEG(), v2.Resize(256, antialias=True), v2.CenterCrop(224),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _jitter_pil() -> Any:
    from torchvision import transforms as T

    return T.Compose([DecodePIL(), T.RandomResizedCrop(224), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor(),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _jitter_tensor() -> Any:
    from torchvision import transforms as T

    return T.Compose([DecodePIL(), T.RandomResizedCrop(224), T.ToTensor(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


# (name, input kind, transform factory): the one definition both sides run
PIPELINES: tuple[tuple[str, str, Callable[[], Any]], ...] = (
    ("CIFAR: RandomCrop(32, pad 4) + flip (PIL)", "cifar", _cifar),
    ("PIL decode + RandomResizedCrop(224) + flip", "jpeg", _pil_rrc),
    ("v2: decode_jpeg + RandomResizedCrop(224) + flip (uint8)", "jpeg", _v2_rrc),
    ("PIL decode + Resize(256) + CenterCrop(224)", "jpeg", _pil_resize),
    ("v2: decode_jpeg + Resize(256) + CenterCrop(224) (uint8)", "jpeg", _v2_resize),
    ("ColorJitter on PIL (after RandomResizedCrop)", "jpeg", _jitter_pil),
    ("ColorJitter on float tensors (after ToTensor)", "jpeg", _jitter_tensor),
)


class Images:
    """A map-style data set of raw items (JPEG bytes, or HxWx3 uint8 arrays given as PIL images, as
    torchvision's CIFAR10 does) with a `transform`, labels i % 10."""

    def __init__(self, items: list[Any], transform: Any, pil: bool) -> None:
        self.items, self.transform, self.pil = items, transform, pil

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        x = self.items[index]
        return self.transform(Image.fromarray(x) if self.pil else x), index % 10


# --------------------------------------------------------------------------------------- inputs
def make_inputs(path: Path, count: int) -> str:
    """Write the inputs every side reads (deterministic: fixed seeds); returns where they came from."""
    rng = np.random.default_rng(20240601)
    try:
        from sklearn.datasets import load_sample_images

        photos = [np.asarray(p, dtype=np.uint8) for p in load_sample_images().images]
        source = "crops of scikit-learn's sample photographs (china.jpg, flower.jpg)"
    except ImportError:
        photos = [_synthetic(rng, 427, 640) for _ in range(2)]
        source = "synthetic images (scikit-learn missing)"
    w, h = JPEG_SIZE
    jpegs, cifar = [], []
    for i in range(count):
        photo = photos[i % len(photos)]
        y, x = int(rng.integers(0, photo.shape[0] - h + 1)), int(rng.integers(0, photo.shape[1] - w + 1))
        buf = io.BytesIO()
        Image.fromarray(photo[y:y + h, x:x + w]).save(buf, format="JPEG", quality=JPEG_QUALITY)
        jpegs.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
        side = int(rng.integers(48, 160))  # a patch of the photograph, shrunk to 32x32 as CIFAR's images were
        y, x = int(rng.integers(0, photo.shape[0] - side + 1)), int(rng.integers(0, photo.shape[1] - side + 1))
        patch = Image.fromarray(photo[y:y + side, x:x + side]).resize((32, 32), Image.Resampling.BOX)
        cifar.append(np.asarray(patch, dtype=np.uint8))
    offsets = np.cumsum([0] + [len(j) for j in jpegs]).astype(np.int64)
    np.savez(path, jpeg=np.concatenate(jpegs), offsets=offsets, cifar=np.stack(cifar))
    return source


def _synthetic(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A natural-looking image: smooth colour gradients, blobs and a little noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        img[..., c] = 128 + 60 * np.sin(xx / rng.uniform(30, 90) + rng.uniform(0, 6)) * np.cos(yy / rng.uniform(30, 90))
    for _ in range(12):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(10, 80)
        img += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))[..., None] * rng.uniform(-80, 80, 3)
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def load_inputs(path: Path) -> dict[str, list[Any]]:
    with np.load(path) as z:
        data, offsets, cifar = z["jpeg"], z["offsets"], z["cifar"]
    return {"jpeg": [data[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])], "cifar": list(cifar)}


def datasets(inputs: dict[str, list[Any]]) -> dict[str, tuple[Any, Any]]:
    """name -> (the data set, its DPU view under `--wire auto` or None where it keeps the float wire)."""
    from dpuoffload.common.data.wire import dpu_view, plan_split
    from dpuoffload.common.modes import Wire

    out = {}
    for name, kind, make in PIPELINES:
        ds = Images(inputs[kind], make(), pil=kind == "cifar")
        split = plan_split(ds, Wire.AUTO)
        out[name] = (ds, None if split is None else dpu_view(ds, split))
    return out


# ----------------------------------------------------------------------------------------- side
def side(args: argparse.Namespace) -> None:
    """One side: fingerprints (and, asked for, step outputs) of every pipeline, pickled into args.side."""
    import torch

    torch.set_num_threads(1)
    t_ready = time.perf_counter()
    built = datasets(load_inputs(args.inputs))
    result: dict[str, Any] = {"platform": Platform.here(), "fingerprints": {}, "seconds": {}, "dumps": {},
                              "steps": {}}
    if args.dump is not None:  # second pass: only the step outputs asked for
        for key in pickle.loads(args.dump.read_bytes()):
            name, wire, index, step = key
            result["dumps"][key] = step_output(_view(built[name], wire), SEED, index, step)
    else:
        reference = pickle.loads(args.reference.read_bytes()) if args.reference else None
        for name, (ds, view) in built.items():
            for wire, d in zip(WIRES, (ds, view)):
                if d is None:
                    continue
                fp = fingerprint(d, SEED, args.samples)
                result["fingerprints"][(name, wire)] = fp
                result["seconds"][(name, wire)] = fp.seconds
                ref = reference["fingerprints"].get((name, wire)) if reference else None
                diff = compare(ref, fp) if ref is not None else None
                if diff is not None:
                    key = (name, wire, diff.index, diff.step)
                    result["dumps"][key] = step_output(d, SEED, diff.index, diff.step)
    result["import_s"] = t_ready - T_START
    result["work_s"] = time.perf_counter() - t_ready
    args.side.write_bytes(pickle.dumps(result))


def _view(pair: tuple[Any, Any], wire: str) -> Any:
    return pair[0] if wire == "float" else pair[1]


# ------------------------------------------------------------------------------------ benchmark
def side_cmd(label: str, out: Path, inputs: Path, samples: int, reference: Optional[Path] = None,
             dump: Optional[Path] = None) -> tuple[list[str], dict[str, str]]:
    argv = [str(Path(__file__).resolve()), "--side", str(out), "--inputs", str(inputs), "--samples", str(samples)]
    argv += ["--reference", str(reference)] if reference else []
    argv += ["--dump", str(dump)] if dump else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if label == X86_DEFAULT:
        env["ATEN_CPU_CAPABILITY"] = "default"
    if label in (REFERENCE, X86_DEFAULT):
        return [sys.executable, *argv], env
    cpu = next(c for c, lab in CPU_LABEL.items() if lab == label)
    env["DPUOFFLOAD_AARCH64_CPU"] = cpu
    return ["bash", str(ROOT / "scripts" / "aarch64.sh"), "python", *argv], env


def run_sides(jobs: dict[str, tuple[list[str], dict[str, str]]], outs: dict[str, Path]) -> dict[str, Any]:
    """Start every side at once, wait for all; returns label -> its pickled result (+ wall_s)."""
    procs, t0 = {}, {}
    for label, (cmd, env) in jobs.items():
        t0[label] = time.perf_counter()
        procs[label] = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
    results = {}
    for label, p in procs.items():
        log, _ = p.communicate(timeout=7200)
        wall = time.perf_counter() - t0[label]
        if p.returncode != 0:
            sys.exit(f"crossarch: side {label} failed ({p.returncode}): {' '.join(jobs[label][0])}\n{log[-4000:]}")
        results[label] = {**pickle.loads(outs[label].read_bytes()), "wall_s": wall}
        print(f"  {label}: {wall:.0f} s ({results[label]['platform'].describe()})", file=sys.stderr, flush=True)
    return results


def measure(args: argparse.Namespace) -> dict[str, Any]:
    labels = [REFERENCE, X86_DEFAULT, *(CPU_LABEL[c] for c in args.cpus)]
    with tempfile.TemporaryDirectory(prefix="crossarch-") as tmp:
        d = Path(tmp)
        inputs = d / "inputs.npz"
        source = make_inputs(inputs, args.samples)
        digest = hashlib.sha256(inputs.read_bytes()).hexdigest()
        outs = {label: d / f"side-{i}.pkl" for i, label in enumerate(labels)}
        print(f"crossarch: {REFERENCE} side (the reference) ...", file=sys.stderr, flush=True)
        sides = run_sides({REFERENCE: side_cmd(REFERENCE, outs[REFERENCE], inputs, args.samples)}, outs)
        print(f"crossarch: {', '.join(labels[1:])} sides at once ...", file=sys.stderr, flush=True)
        sides.update(run_sides({lab: side_cmd(lab, outs[lab], inputs, args.samples, reference=outs[REFERENCE])
                                for lab in labels[1:]}, outs))
        wanted = sorted({k for lab in labels[1:] for k in sides[lab]["dumps"]}, key=str)
        ref_dumps: dict[Any, np.ndarray] = {}
        if wanted:
            req, out = d / "requests.pkl", d / "ref-dumps.pkl"
            req.write_bytes(pickle.dumps(wanted))
            print(f"crossarch: {REFERENCE} step outputs of {len(wanted)} first differences ...", file=sys.stderr,
                  flush=True)
            ref_dumps = run_sides({"dump": side_cmd(REFERENCE, out, inputs, args.samples, dump=req)},
                                  {"dump": out})["dump"]["dumps"]
    return {"labels": labels, "sides": sides, "ref_dumps": ref_dumps, "inputs": {"source": source, "sha256": digest}}


def analyze(m: dict[str, Any]) -> list[dict[str, Any]]:
    sides, ref = m["sides"], m["sides"][REFERENCE]
    rows = []
    for name, kind, _ in PIPELINES:
        fp = ref["fingerprints"][(name, "float")]
        view = ref["fingerprints"].get((name, "uint8"))
        row: dict[str, Any] = {"pipeline": name, "input": kind, "steps": list(fp.steps),
                               "dpu_steps": list(view.steps) if view else None, "vs": {}}
        for label in m["labels"][1:]:
            row["vs"][label] = {}
            for wire in WIRES:
                a, b = ref["fingerprints"].get((name, wire)), sides[label]["fingerprints"].get((name, wire))
                if a is None or b is None:
                    row["vs"][label][wire] = None
                    continue
                diff = compare(a, b)
                entry: dict[str, Any] = {"compared": min(len(a.samples), len(b.samples)),
                                         "identical": sum(x == y for x, y in zip(a.samples, b.samples)),
                                         "seconds": [a.seconds, b.seconds]}
                if diff is not None:
                    key = (name, wire, diff.index, diff.step)
                    mag = Magnitude.of(m["ref_dumps"][key], sides[label]["dumps"][key])
                    step_type = "sample" if diff.step is None else diff.step_name.split("(")[0]
                    entry["first"] = {"sample": diff.index, "step": diff.step, "step_name": diff.step_name,
                                      "step_type": step_type, "differing": mag.differing, "elements": mag.total,
                                      "max_abs": mag.max_abs, "magnitude": mag.describe()}
                row["vs"][label][wire] = entry
        rows.append(row)
    return rows


def _cell(entry: Optional[dict[str, Any]]) -> str:
    return "n/a" if entry is None else f"{entry['identical']}/{entry['compared']}"


def markdown(rows: list[dict[str, Any]], m: dict[str, Any]) -> str:
    sides, labels = m["sides"], m["labels"]
    n1, a72 = CPU_LABEL["neoverse-n1"], CPU_LABEL["cortex-a72"]
    header = ["pipeline", f"{REFERENCE} vs {n1}, float wire", f"vs {n1}, uint8 wire (DPU part)",
              f"vs {a72}, float / uint8", f"{X86_DEFAULT} vs AVX2, float / uint8",
              "first differing step (sample: magnitude)"]
    body = []
    for r in rows:
        vs = r["vs"]

        def pair(label: str) -> str:
            return "not run" if label not in vs else f"{_cell(vs[label]['float'])} / {_cell(vs[label]['uint8'])}"

        groups: dict[str, dict[str, list[str]]] = {}  # the same first difference, seen by several sides
        for label in labels[1:]:
            for wire in WIRES:
                e = vs[label][wire]
                if e and "first" in e:
                    f = e["first"]
                    what = f"step {f['step']} {f['step_type']} (sample {f['sample']}: {f['magnitude']})"
                    groups.setdefault(what, {}).setdefault(label.replace("aarch64 ", ""), []).append(wire)
        firsts = [", ".join(lab if len(w) == len(WIRES) else f"{lab} {'+'.join(w)}" for lab, w in who.items())
                  + f": {what}" for what, who in groups.items()]
        body.append([r["pipeline"],
                     "not run" if n1 not in vs else _cell(vs[n1]["float"]),
                     "not run" if n1 not in vs else _cell(vs[n1]["uint8"]),
                     pair(a72), pair(X86_DEFAULT), "; ".join(firsts) or "none"])
    lines = [f"Samples identical out of {m['samples']} (seed 0, epoch 0, per-sample seeds), each side on one torch "
             f"thread; reference {REFERENCE}: {sides[REFERENCE]['platform'].describe()}; "
             + "; ".join(f"{lab}: {sides[lab]['platform'].describe()}" for lab in labels[1:] if lab != X86_DEFAULT)
             + ". uint8 wire: the DPU part under `--wire auto` (n/a: the pipeline keeps the float wire).",
             "", table(header, body), "",
             *_others_line(rows, m), "Side wall time (interpreter start and imports; fingerprinting): "
             + ", ".join(f"{lab} {sides[lab]['wall_s']:.0f} s ({sides[lab]['import_s']:.0f} s; "
                         f"{sides[lab]['work_s']:.0f} s)" for lab in labels) + "."]
    return "\n".join(lines)


def cross_check(m: dict[str, Any]) -> dict[str, dict[str, Optional[str]]]:
    """The aarch64 sides against the x86 scalar kernels (`x86 default`), not the reference: pipeline ->
    "label wire" -> identical/compared (tells the architecture from the x86 kernel level)."""
    sides, out = m["sides"], {}
    for name, _, _ in PIPELINES:
        out[name] = {}
        for label in m["labels"][2:]:
            for wire in WIRES:
                a = sides[X86_DEFAULT]["fingerprints"].get((name, wire))
                b = sides[label]["fingerprints"].get((name, wire))
                out[name][f"{label} {wire}"] = None if a is None or b is None else (
                    f"{sum(x == y for x, y in zip(a.samples, b.samples))}/{min(len(a.samples), len(b.samples))}")
    return out


def _others_line(rows: list[dict[str, Any]], m: dict[str, Any]) -> list[str]:
    if len(m["labels"]) < 3:
        return []
    parts = []
    for i, r in enumerate(rows, 1):
        cells = r["vs_x86_default"]
        parts.append(f"{i}. " + ", ".join(f"{k.replace('aarch64 ', '')} {v or 'n/a'}" for k, v in cells.items()))
    return [f"The aarch64 sides against {X86_DEFAULT} (torch's scalar kernels) instead, per pipeline: "
            + "; ".join(parts) + ".", ""]


def _platform(p: Platform) -> dict[str, Any]:
    return {"machine": p.machine, "byteorder": p.byteorder, "cpu_capability": p.cpu_capability,
            "versions": dict(p.versions), "describe": p.describe()}


def run(args: argparse.Namespace) -> Section:
    if args.quick:
        args.samples, args.cpus = 8, args.cpus[:1]
    t0 = time.perf_counter()
    info = machine()
    m = measure(args)
    m["samples"] = args.samples
    rows = analyze(m)
    for row, cells in zip(rows, cross_check(m).values()):
        row["vs_x86_default"] = cells
    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    sides = {lab: {"platform": _platform(s["platform"]), "qemu_cpu": next((c for c, v in CPU_LABEL.items()
                                                                           if v == lab), None),
                   "wall_s": s["wall_s"], "import_s": s["import_s"], "work_s": s["work_s"],
                   "fingerprint_s": {f"{k[0]} | {k[1]}": v for k, v in s["seconds"].items()}}
             for lab, s in m["sides"].items()}
    text = markdown(rows, m)
    payload = {"machine": info, "settings": {"samples": args.samples, "seed": SEED, "cpus": list(args.cpus),
                                             "torch_threads": 1, "quick": args.quick},
               "inputs": {**m["inputs"], "jpeg_size": list(JPEG_SIZE), "jpeg_quality": JPEG_QUALITY},
               "reference": REFERENCE, "sides": sides, "pipelines": rows, "table": text,
               "wall_s": time.perf_counter() - t0}
    write_json(args.out, payload)
    return Section("crossarch", payload, text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=SAMPLES, help=f"samples per pipeline (default: {SAMPLES})")
    p.add_argument("--cpus", type=lambda s: [c for c in s.split(",") if c], default=list(CPUS),
                   help=f"qemu CPUs of the aarch64 sides, comma-separated (default: {','.join(CPUS)})")
    p.add_argument("--quick", action="store_true", help="8 samples, the first CPU only")
    p.add_argument("--out", type=Path, default=RESULTS / "crossarch.json")
    p.add_argument("--side", type=Path, metavar="OUT", help="run one side on this interpreter, pickle into OUT")
    p.add_argument("--inputs", type=Path, help="--side: the inputs .npz the benchmark wrote")
    p.add_argument("--reference", type=Path, help="--side: a reference side's pickle; dump the step output "
                                                  "of each pipeline's first difference from it")
    p.add_argument("--dump", type=Path, help="--side: only the step outputs of these pickled "
                                             "(pipeline, wire, sample, step) keys")
    return p


def main() -> int:
    args = build_parser().parse_args()
    if args.side is not None:
        if args.inputs is None:
            sys.exit("--side needs --inputs")
        side(args)
        return 0
    unknown = [c for c in args.cpus if c not in CPUS]
    if unknown:
        sys.exit(f"--cpus: unknown {', '.join(unknown)} (known: {', '.join(CPUS)})")
    section = run(args)
    print(section.markdown)
    print(f"\n(benchmark wall time {section.payload['wall_s']:.0f} s; results in {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
