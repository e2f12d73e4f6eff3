"""The TFT's int8 forward rebuilt in plain numpy from an export alone (issue 27):
``python experiments/int8_numpy_reference.py --export DIR [--json]``.

Reads ``DIR/config.json``, ``DIR/model_int8.safetensors`` and ``DIR/samples.safetensors``
(written by ``python -m tftjax.export``), runs the op-by-op semantics of
``docs/int8_format.md`` on the sample windows and prints the largest difference from
tftjax's int8 outputs for them, in output units and in output quantisation steps (the
quantile head's ``s_x · s_w``; a float head: float32 round-off, 1e-5 of the largest output).
Exit 0 when it is within that, 1 otherwise, 2 on bad
input (a float-only export, a missing file, an export from before scales were stored).

It imports numpy and safetensors only: no JAX, Flax or tftjax (checked at the end).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

F32 = np.float32


def flat_config(model: dict) -> dict:
    """The model config's fields by name, from either layout: schema 2 (tftjax 0.2.0 on:
    its parts ``model``, ``head``, ``quant``, ``execution``, ``data`` nested) or schema 1
    (flat)."""
    parts = ("model", "head", "quant", "execution", "data")
    if isinstance(model.get("model"), dict):
        return {k: v for p in parts for k, v in model.get(p, {}).items()}
    return model


class BadExport(Exception):
    """An export this reference cannot rebuild (one line, exit 2)."""


def nest(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        *head, last = key.split("/")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return out


def quantize(x, scale, zero_point):
    """int8 ``clip(round_half_even(x · (1/s)) + zp, -128, 127)``, the reciprocal in float32."""
    return np.clip(np.round(x * (F32(1) / scale)) + zero_point, -128, 127).astype(np.int8)


def int8_matmul(qx, scale, zero_point, qw, w_scale):
    """``s·s_w (Σ qx·qw − zp Σ qw)`` with int32 accumulation (the last axis of ``qx`` against
    the first of ``qw``)."""
    acc = np.matmul(qx.astype(np.int32), qw.astype(np.int32))
    corr = np.int32(zero_point) * qw.astype(np.int32).sum(0)
    return (acc - corr).astype(F32) * (scale * w_scale.reshape(-1))


def sigmoid(x):
    return (1 / (1 + np.exp(-x))).astype(F32)


def elu(x):
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0))).astype(F32)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(F32)


LN_EPS = F32(1e-6)


def layer_norm(x, scale, bias, eps=LN_EPS):
    """flax's LayerNorm: variance as E[x²] − E[x]², floored at 0."""
    mean = x.mean(-1, keepdims=True)
    var = np.maximum(F32(0), np.square(x).mean(-1, keepdims=True) - np.square(mean))
    return (x - mean) * ((1 / np.sqrt(var + eps)) * scale) + bias


class Int8TFT:
    """The int8 TFT of an export: ``Int8TFT(dir)(static, historical, known)`` → quantiles."""

    def __init__(self, export: Path):
        from safetensors.numpy import load_file

        if not (export / "config.json").is_file():
            raise BadExport(f"{export}: no config.json (not a tftjax export)")
        if not (export / "model_int8.safetensors").is_file():
            raise BadExport(
                f"{export} holds float32 weights only (no model_int8.safetensors): "
                "export a --qat run, or a float one with --calibrate N"
            )
        self.cfg = flat_config(json.loads((export / "config.json").read_text())["model"])
        t = nest(load_file(str(export / "model_int8.safetensors")))
        if "act_qparams" not in t:
            raise BadExport(
                f"{export}: no act_qparams (an export from before scales and zero "
                "points were stored; export it again)"
            )
        self.p, self.ws, self.aq = t["params"], t.get("weight_scale", {}), t["act_qparams"]

    # -------------------------------------------------------------- building blocks
    @staticmethod
    def at(tree, path):
        for k in path.split("/"):
            tree = tree[k]
        return tree

    def matmul(self, path, param, x):
        """``x @ W`` of kernel ``param`` in module ``path``: int8 where it is int8."""
        w = self.at(self.p, path)[param]
        if w.dtype != np.int8:
            return np.matmul(x, w)
        a = self.at(self.aq, path)[f"{param}_in"]
        s, zp = a["scale"], a["zero_point"]
        return int8_matmul(quantize(x, s, zp), s, zp, w, self.at(self.ws, path)[param])

    def dense(self, path, x):
        y = self.matmul(path, "kernel", x)
        bias = self.at(self.p, path).get("bias")
        return y if bias is None else y + bias

    def glu(self, path, x):
        value, gate = np.split(self.dense(f"{path}/proj", x), 2, axis=-1)
        return sigmoid(gate) * value

    def norm(self, path, x):
        n = self.at(self.p, path)
        return layer_norm(x, n["scale"], n["bias"])

    def grn(self, path, a, context=None):
        node = self.at(self.p, path)
        skip = self.dense(f"{path}/skip", a) if "skip" in node else a
        h = self.dense(f"{path}/fc2", a)
        if context is not None:
            h = h + self.dense(f"{path}/context", context)
        h = self.dense(f"{path}/fc1", elu(h))
        return self.norm(f"{path}/norm", skip + self.glu(f"{path}/glu", h))

    def gate_add_norm(self, path, a, b):
        return self.norm(f"{path}/norm", a + self.glu(f"{path}/glu", b))

    def kern(self, path, name):
        """A stacked kernel used weight-only (dequantized where int8)."""
        w = self.at(self.p, path)[name]
        return w.astype(F32) * self.at(self.ws, path)[name] if w.dtype == np.int8 else w

    # -------------------------------------------------------------- variable selection
    def folded(self, path, x, emb_k, emb_b):
        """The selection GRN's input matmul over the embeddings of ``x`` [N, m], folded."""
        n = self.at(self.p, path)
        if "fold_bias" in n:  # int8: the folded kernel A [m, out]
            y = self.matmul(path, "kernel", x) + n["fold_bias"]
        else:
            m, dv = emb_k.shape
            k = n["kernel"]
            a = np.einsum("mv,mvo->mo", emb_k, k.reshape(m, dv, -1))
            y = x @ a + emb_b.reshape(-1) @ k
        return y + n["bias"] if "bias" in n else y

    def selection(self, path, xf, emb_k, emb_b, ctx, extra=None):
        m, dv = emb_k.shape
        if dv == 1 or extra is not None:  # not folded: a GRN over the flat embeddings
            flat = xf[:, :, None] * emb_k + emb_b  # [N, m, d_v]
            if extra is not None:
                flat[:, 0] += extra
            return self.grn(f"{path}/weights", flat.reshape(len(xf), m * dv), ctx)
        w = f"{path}/weights"
        skip = self.folded(f"{w}/skip", xf, emb_k, emb_b)
        h = self.folded(f"{w}/fc2", xf, emb_k, emb_b)
        if ctx is not None:
            h = h + self.dense(f"{w}/context", ctx)
        h = self.dense(f"{w}/fc1", elu(h))
        return self.norm(f"{w}/norm", skip + self.glu(f"{w}/glu", h))

    def stacked_matmul(self, path, name, h):
        """Per-variable ``[m, N, i] × [m, i, o]``; int8 with per-variable activation qparams."""
        w = self.at(self.p, path)[name]
        if w.dtype != np.int8:
            return np.matmul(h, w)
        a = self.at(self.aq, path)[f"{name}_in"]
        s, zp = a["scale"][:, None, None], a["zero_point"][:, None, None]
        acc = np.matmul(quantize(h, s, zp).astype(np.int32), w.astype(np.int32))
        corr = zp.astype(np.int32) * w.astype(np.int32).sum(1, keepdims=True)
        return (acc - corr).astype(F32) * (s * self.at(self.ws, path)[name])

    def vsn(self, path, x, context=None, index=None):
        """Variable selection over ``x`` [..., m]; ``index``: variable 0 is the instrument,
        its embedding a row of ``instrument_table``."""
        p = self.at(self.p, path)
        m = x.shape[-1]
        lead = x.shape[:-1]
        xf = x.reshape(-1, m).copy()
        extra = None
        if index is not None:
            extra = p["instrument_table"][index]  # [N, d_v]
            xf[:, 0] = 0
        ctx = None
        if context is not None:
            ctx = np.broadcast_to(context, lead + context.shape[-1:]).reshape(xf.shape[0], -1)
        emb_k, emb_b = self.kern(path, "emb_k"), p["emb_b"]
        w = softmax(self.selection(path, xf, emb_k, emb_b, ctx, extra))  # [N, m]
        xv = xf.T[..., None]  # [m, N, 1]

        def fold(k):
            return (
                np.einsum("mv,mvo->mo", emb_k, k)[:, None, :],
                np.einsum("mv,mvo->mo", emb_b, k)[:, None, :],
            )

        sk, sb = fold(self.kern(path, "skip_k"))
        skip = xv * sk + (sb + p["skip_b"][:, None, :])
        fk, fb = fold(self.kern(path, "fc2_k"))
        h = xv * fk + (fb + p["fc2_b"][:, None, :])
        if extra is not None:  # e_0 += the table row: W e_0 gains W · row
            skip[0] += extra @ self.kern(path, "skip_k")[0]
            h[0] += extra @ self.kern(path, "fc2_k")[0]
        h = elu(h)
        h = self.stacked_matmul(path, "fc1_k", h) + p["fc1_b"][:, None, :]
        z = self.stacked_matmul(path, "glu_k", h) + p["glu_b"][:, None, :]
        value, gate = np.split(z, 2, axis=-1)
        y = skip + sigmoid(gate) * value  # [m, N, d]
        mean = y.mean(-1, keepdims=True)
        rstd = 1 / np.sqrt(np.square(y - mean).mean(-1, keepdims=True) + F32(1e-6))
        y = (y - mean) * rstd * p["ln_scale"][:, None, :] + p["ln_bias"][:, None, :]
        out = np.einsum("mn,mnd->nd", w.T, y)
        return out.reshape(lead + (out.shape[-1],)).astype(F32)

    # -------------------------------------------------------------- sequence layers
    def lstm(self, path, carry, xs):
        b = self.at(self.p, path)["b"]
        xp = self.matmul(path, "w_i", xs) + b  # [B, T, 4d]
        c, h = carry
        hs = []
        for t in range(xs.shape[1]):
            gates = xp[:, t] + self.matmul(path, "w_h", h)
            i, f, g, o = np.split(gates, 4, axis=-1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            hs.append(h)
        return (c, h), np.stack(hs, axis=1)

    def attention(self, path, q_in, kv, te, td):
        heads, d = self.cfg["heads"], self.cfg["hidden"]
        dh = d // heads
        q = self.dense(f"{path}/query", q_in).reshape(q_in.shape[:-1] + (heads, dh))
        k = self.dense(f"{path}/key", kv).reshape(kv.shape[:-1] + (heads, dh))
        v = self.dense(f"{path}/value", kv)
        logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(F32(dh))
        mask = np.arange(te + td)[None, :] <= (te + np.arange(td))[:, None]
        logits = np.where(mask, logits, np.finfo(F32).min)
        mixed = np.einsum("bhqk,bkd->bqd", softmax(logits), v) / F32(heads)
        return self.dense(f"{path}/out", mixed)

    # -------------------------------------------------------------- the model
    def __call__(self, static, historical, known, instrument=None):
        te = historical.shape[1]
        td = known.shape[1] - te
        index = None
        if self.cfg.get("instruments"):  # static input 0: the instrument, a vocabulary row
            index = (
                np.asarray(instrument, np.int32)
                if instrument is not None  # int32 input
                else np.clip(static[:, 0].astype(np.int32), 0, self.cfg["instruments"])
            )
            if index.min() < 0 or index.max() > self.cfg["instruments"]:
                raise ValueError(f"instrument indices outside 0..{self.cfg['instruments']}")
        zeta = self.vsn("static_vsn", static, index=index)
        c_s, c_e, c_h, c_c = (
            self.grn(f"static_{n}", zeta) for n in ("selection", "enrichment", "state_h", "state_c")
        )
        past = np.concatenate([historical, known[:, :te]], axis=-1)
        xi_enc = self.vsn("encoder_vsn", past, c_s[:, None, :])
        xi_dec = self.vsn("decoder_vsn", known[:, te:], c_s[:, None, :])
        carry, h_enc = self.lstm("lstm_encoder", (c_c, c_h), xi_enc)
        _, h_dec = self.lstm("lstm_decoder", carry, xi_dec)
        phi = np.concatenate([h_enc, h_dec], axis=1)
        xi = np.concatenate([xi_enc, xi_dec], axis=1)
        phi_t = self.gate_add_norm("lstm_gate", xi, phi)
        theta = self.grn("enrichment", phi_t, c_e[:, None, :])
        attn = self.attention("attention", theta[:, te:], theta, te, td)
        delta = self.gate_add_norm("attention_gate", theta[:, te:], attn)
        psi = self.grn("positionwise", delta)
        psi_t = self.gate_add_norm("output_gate", phi_t[:, te:], psi)
        pred = self.dense("quantiles", psi_t).astype(F32)
        if self.cfg.get("monotone_quantiles"):
            qs = np.asarray(self.cfg["quantiles"])
            m = int(np.argmin(np.abs(qs - 0.5)))
            base = pred[..., m : m + 1]
            up = base + np.cumsum(np.logaddexp(pred[..., m + 1 :], 0), axis=-1)
            down = base - np.cumsum(np.logaddexp(pred[..., :m][..., ::-1], 0), axis=-1)[..., ::-1]
            pred = np.concatenate([down, base, up], axis=-1)
        return pred

    def output_step(self) -> np.ndarray | None:
        """The quantile head's output quantisation step per output (``s_x · s_w``), or None
        when the head is float."""
        if self.p["quantiles"]["kernel"].dtype != np.int8:
            return None
        return self.aq["quantiles"]["kernel_in"]["scale"] * self.ws["quantiles"]["kernel"].reshape(
            -1
        )


def compare(export: Path) -> dict:
    from safetensors.numpy import load_file

    model = Int8TFT(export)
    if not (export / "samples.safetensors").is_file():
        raise BadExport(f"{export}: no samples.safetensors (export it again)")
    s = load_file(str(export / "samples.safetensors"))
    got = model(s["static"], s["historical"], s["known"], s.get("instrument"))
    diff = np.abs(got - s["int8_output"])
    step = model.output_step()
    return {
        "windows": int(got.shape[0]),
        "max_abs_diff": float(diff.max()),
        # a float quantile head (not in --qat-layers): float32 round-off of the outputs
        "float_tolerance": float(1e-5 * max(1.0, float(np.abs(s["int8_output"]).max()))),
        "max_diff_in_steps": None if step is None else float((diff / step).max()),
        # windows whose every output is within one step: numpy's exp/tanh and XLA's may
        # differ in the last ulp (per CPU), and a value that then rounds to the other
        # int8 code moves everything after it in that window, not in the others
        "windows_within_one_step": None
        if step is None
        else int(((diff / step).reshape(diff.shape[0], -1).max(axis=1) <= 1.0).sum()),
        "output_step": None if step is None else [float(a) for a in step],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python experiments/int8_numpy_reference.py", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--export", type=Path, required=True, help="a tftjax export folder")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args(argv)
    try:
        r = compare(args.export)
    except BadExport as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    imported = sorted(m for m in ("jax", "flax", "tftjax") if m in sys.modules)
    r["imported"] = imported
    if args.json:
        print(json.dumps(r))
    else:
        steps = r["max_diff_in_steps"]
        print(
            f"{r['windows']} sample windows: largest difference from tftjax's int8 outputs "
            f"{r['max_abs_diff']:.3g}"
            + ("" if steps is None else f" ({steps:.3g} output quantisation steps)")
        )
        print(f"modules imported of jax, flax, tftjax: {imported or 'none'}")
    ok = not imported and (
        r["max_diff_in_steps"] <= 1.0
        if r["max_diff_in_steps"] is not None
        else r["max_abs_diff"] <= r["float_tolerance"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
