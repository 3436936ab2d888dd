"""LSTM caption decoder with optional attention over N annotation vectors.

One code path, switched by ``DecoderConfig.variant``:

- ``show_tell`` (Vinyals et al. 2015): the mean annotation, projected to the embedding size,
  is the LSTM's first input (step ``-1``); no context afterwards.
- ``mean_pool`` (Venugopalan et al. 2015): the fixed uniform context ``mean_i v_i`` is fed
  with the word embedding at every step.
- ``soft_attention`` (Xu et al. 2015 / Bahdanau et al. 2014 / Yao et al. 2015 for frames):
  ``z_t = beta_t * sum_i alpha_ti v_i`` with ``alpha_t = softmax(score(h_{t-1}, v))``.
- ``hard_attention`` (Xu et al. 2015 Sec. 4.1): ``z_t = beta_t * v_{s_t}``,
  ``s_t ~ Categorical(alpha_t)``, trained with REINFORCE (see ``compute_loss``).

Step ``t`` (inputs ``y_{t-1}``): ``z_t`` from ``h_{t-1}`` (top layer);
``h_t = LSTM([E y_{t-1}; z_t], h_{t-1})``; with ``deep_output``
``p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))`` (Xu eq. 7), else ``softmax(L_o h_t)``.

Training (``compute_loss``) embeds all tokens at once, projects the keys ``U_a v`` once per
sequence, runs the LSTM loop over the sequences still running at each step (the batch sorted
by length, so they are a prefix), and computes the vocabulary logits of all REAL tokens after
the loop in one matmul.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.models.attention import (
    SelectorGate,
    argmax_location,
    attention_entropy,
    build_attention,
    doubly_stochastic_penalty,
    expand_groups,
    hard_context,
    location_log_prob,
    masked_mean,
    masked_softmax,
    reinforce_surrogate,
    sample_location,
    soft_context,
    update_baseline,
)

__all__ = ["VARIANTS", "CaptionDecoder", "DecoderConfig", "DecoderState"]

VARIANTS = ("show_tell", "mean_pool", "soft_attention", "hard_attention")
SCORINGS = ("additive", "dot", "general")
TEST_MODES = ("argmax", "expectation")


class _WeightGradSink(torch.autograd.Function):
    """Identity-like node on a weight: its backward computes the weight's gradient for all
    steps at once from what the per-step ``_DeferredMatmul`` nodes collected."""

    @staticmethod
    def forward(ctx, weight: Tensor, collector: _DeferredLinear) -> Tensor:  # type: ignore[override]
        ctx.collector = collector
        ctx.shape, ctx.dtype = weight.shape, weight.dtype
        return weight.new_zeros(())

    @staticmethod
    def backward(ctx, _grad: Tensor):  # type: ignore[override]
        col = ctx.collector
        if not col.grads:
            return None, None
        g = torch.cat(col.grads, 0)  # [sum R, out]
        x = torch.cat([xi.to(g.dtype) for xi in col.inputs], 0)  # [sum R, in]
        col.grads.clear()
        col.inputs.clear()
        return (g.t() @ x).to(ctx.dtype), None


class _DeferredMatmul(torch.autograd.Function):
    """``x @ W^T`` whose backward only returns ``dx`` and stores ``(dy, x)`` for the sink."""

    @staticmethod
    def forward(
        ctx, x: Tensor, weight: Tensor, token: Tensor, collector: _DeferredLinear
    ) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.collector = collector
        return F.linear(x, weight.to(x.dtype))

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        ctx.collector.grads.append(grad)
        ctx.collector.inputs.append(x)
        dx = grad @ weight.to(grad.dtype) if ctx.needs_input_grad[0] else None
        return dx, None, grad.new_zeros(()), None


class _DeferredLinear:
    """``x @ W^T`` applied at every time step, with the weight gradient computed ONCE.

    A per-step ``nn.Linear`` makes autograd materialise and accumulate a full ``[out, in]``
    weight gradient at every step (for the LSTM's context weights 2048 x 2048 per step);
    here each step's backward only records ``(dy_t, x_t)`` and the sink computes
    ``dW = [dy_1; ...; dy_T]^T [x_1; ...; x_T]`` in one matmul.  Without grad it is F.linear.
    """

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        self.grads: list[Tensor] = []
        self.inputs: list[Tensor] = []
        self.token = (
            _WeightGradSink.apply(weight, self)
            if (torch.is_grad_enabled() and weight.requires_grad)
            else None
        )

    def __call__(self, x: Tensor) -> Tensor:
        if self.token is None:
            return F.linear(
                x, self.weight.to(x.dtype) if x.dtype != self.weight.dtype else self.weight
            )
        return _DeferredMatmul.apply(x, self.weight, self.token, self)


def _pad_rows_and_stack(xs: list[Tensor], rows: int) -> Tensor:
    """Per-step tensors ``xs[t] [R_t, ...]`` (``R_t <= rows``) -> ``[rows, T, ...]``, zero-padded."""
    return torch.stack([F.pad(x, (0, 0) * (x.dim() - 1) + (0, rows - x.shape[0])) for x in xs], 1)


def _lstm_pointwise(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """LSTM update from pre-activations ``gates [R,4H]`` (PyTorch order i, f, g, o)."""
    i, f, g, o = gates.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


@dataclass
class DecoderConfig:
    """Decoder hyper-parameters (OmegaConf structured-config compatible)."""

    variant: str = "soft_attention"  # show_tell | mean_pool | soft_attention | hard_attention
    scoring: str = "additive"  # additive | dot | general
    embed_dim: int = 256
    hidden_dim: int = 512
    attention_dim: int = 256
    num_layers: int = 1
    dropout: float = 0.3
    init_from_mean: bool = True  # h0/c0 = tanh(MLP(mean annotation)); show_tell: image is x_{-1}
    gate: bool = True  # Xu's selector beta = sigmoid(W_beta h)
    deep_output: bool = True  # L_o(E y_{t-1} + L_h h_t + L_z z_t)
    bidirectional_encoder: bool = False  # BiLSTM over the N positions (frames) before attention
    doubly_stochastic: float = 1.0  # lambda of sum_i (1 - sum_t alpha_ti)^2
    # hard attention
    soft_fraction: float = 0.5  # share of training batches that use the soft expectation
    entropy_weight: float = 0.01
    baseline_decay: float = 0.9
    reinforce_weight: float = 1.0
    test_mode: str = "argmax"  # argmax | expectation

    def validate(self) -> DecoderConfig:
        """Raise ``ConfigError`` naming the bad key; returns ``self``."""
        choices = {"variant": VARIANTS, "scoring": SCORINGS, "test_mode": TEST_MODES}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(
                    f"model.decoder.{key}={getattr(self, key)!r} is not one of {list(allowed)}; "
                    f"set it to one of those"
                )
        for key in ("embed_dim", "hidden_dim", "attention_dim", "num_layers"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"model.decoder.{key} must be >= 1 (got {getattr(self, key)})")
        for key in ("dropout", "soft_fraction", "baseline_decay"):
            v = float(getattr(self, key))
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"model.decoder.{key} must be in [0, 1] (got {v})")
        if self.bidirectional_encoder and self.hidden_dim < 2:
            raise ConfigError("model.decoder.hidden_dim must be >= 2 with bidirectional_encoder")
        return self

    @classmethod
    def from_any(cls, cfg: Any) -> DecoderConfig:
        """Accept a ``DecoderConfig``, a dict or an OmegaConf node; unknown keys -> ``ConfigError``."""
        if isinstance(cfg, cls):
            return cfg
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:  # pragma: no cover
            pass
        if not isinstance(cfg, dict):
            raise ConfigError(f"decoder config must be a mapping, got {type(cfg).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ConfigError(
                f"unknown decoder config key(s) {unknown}; valid keys are {sorted(known)}"
            )
        return cls(**cfg)


@dataclass
class DecoderState:
    """Recurrent state of ``R`` decoding rows plus the per-item memory they attend.

    ``h``, ``c``: ``[L, R, H]``.  Memory tensors have ``M = R / group`` rows: ``values``
    ``[M,N,C]``, ``keys`` ``[M,N,A]``, ``mask`` ``[M,N]`` bool, ``context`` ``[M,C]``
    (mean_pool's fixed context).  Row ``r`` attends memory row ``r // group``; beam search
    keeps ``group = K`` so the K beams of an item share one copy of the memory.
    """

    h: Tensor
    c: Tensor
    values: Tensor | None = None
    keys: Tensor | None = None
    mask: Tensor | None = None
    context: Tensor | None = None
    group: int = 1

    @property
    def rows(self) -> int:
        return self.h.shape[1]

    def _memory(self) -> dict[str, Tensor | None]:
        return {
            "values": self.values,
            "keys": self.keys,
            "mask": self.mask,
            "context": self.context,
        }

    def index_select(self, idx: Tensor, within_groups: bool = False) -> DecoderState:
        """Reorder/select rows (beam reordering): new row ``j`` is old row ``idx[j]``.

        ``within_groups=True`` promises ``idx[j] // group == j // group`` (each row keeps its
        memory item, as in beam search); then only ``h``/``c`` are gathered.  Otherwise the
        memory is gathered too and ``group`` becomes 1.
        """
        h = self.h.index_select(1, idx)
        c = self.c.index_select(1, idx)
        if within_groups:
            return replace(self, h=h, c=c)
        mem_idx = torch.div(idx, self.group, rounding_mode="floor")
        mem = {
            k: (None if v is None else v.index_select(0, mem_idx))
            for k, v in self._memory().items()
        }
        return DecoderState(h=h, c=c, group=1, **mem)

    def repeat_interleave(self, k: int) -> DecoderState:
        """Each row repeated ``k`` times consecutively; the memory is shared (``group *= k``)."""
        return replace(
            self,
            h=self.h.repeat_interleave(k, dim=1),
            c=self.c.repeat_interleave(k, dim=1),
            group=self.group * k,
        )

    def select_groups(self, groups: Tensor) -> DecoderState:
        """Keep memory items ``groups [M']`` and all their rows (drops finished items)."""
        g = self.group
        rows = (groups.unsqueeze(1) * g + torch.arange(g, device=groups.device)).reshape(-1)
        mem = {
            k: (None if v is None else v.index_select(0, groups)) for k, v in self._memory().items()
        }
        return DecoderState(
            h=self.h.index_select(1, rows), c=self.c.index_select(1, rows), group=g, **mem
        )


class CaptionDecoder(nn.Module):
    """LSTM decoder for all four variants; see the module docstring.

    ``features [B,N,C]`` annotation vectors, ``mask [B,N]`` bool (True = real position) or
    ``None``.  With ``bidirectional_encoder`` the mask must mark a prefix of real positions
    (as frame features do).
    """

    def __init__(
        self, cfg: DecoderConfig | Any, vocab_size: int, feature_dim: int, pad_id: int = 0
    ):
        super().__init__()
        cfg = DecoderConfig.from_any(cfg).validate()
        self.cfg = cfg
        self.vocab_size = int(vocab_size)
        self.feature_dim = int(feature_dim)
        self.pad_id = int(pad_id)
        E, H, L = cfg.embed_dim, cfg.hidden_dim, cfg.num_layers
        self.uses_attention = cfg.variant in ("soft_attention", "hard_attention")
        self.uses_context = cfg.variant != "show_tell"
        self.hard = cfg.variant == "hard_attention"

        self.embedding = nn.Embedding(self.vocab_size, E, padding_idx=self.pad_id)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        with torch.no_grad():
            self.embedding.weight[self.pad_id].zero_()

        if cfg.bidirectional_encoder:
            self.encoder: nn.LSTM | None = nn.LSTM(
                feature_dim, H // 2, batch_first=True, bidirectional=True
            )
            ctx_dim = 2 * (H // 2)
        else:
            self.encoder = None
            ctx_dim = feature_dim
        self.context_dim = ctx_dim

        self.attention = (
            build_attention(cfg.scoring, H, ctx_dim, cfg.attention_dim)
            if self.uses_attention
            else None
        )
        self.gate = SelectorGate(H) if (self.uses_attention and cfg.gate) else None

        in0 = E + (ctx_dim if self.uses_context else 0)
        self.cells = nn.ModuleList([nn.LSTMCell(in0 if i == 0 else H, H) for i in range(L)])

        self.image_proj = nn.Linear(ctx_dim, E) if cfg.variant == "show_tell" else None
        if cfg.variant != "show_tell" and cfg.init_from_mean:
            self.init_h: nn.Linear | None = nn.Linear(ctx_dim, L * H)
            self.init_c: nn.Linear | None = nn.Linear(ctx_dim, L * H)
        else:
            self.init_h = self.init_c = None

        self.dropout = nn.Dropout(cfg.dropout)
        if cfg.deep_output:
            # [L_h ; L_z] as one linear layer on [h_t ; z_t]
            self.out_hidden: nn.Linear | None = nn.Linear(
                H + (ctx_dim if self.uses_context else 0), E
            )
            self.out_vocab = nn.Linear(E, self.vocab_size)
        else:
            self.out_hidden = None
            self.out_vocab = nn.Linear(H, self.vocab_size)

        # hard attention: moving-average baseline of the reward and how often it was updated
        self.register_buffer("reinforce_baseline", torch.zeros(()))
        self.register_buffer("reinforce_updates", torch.zeros((), dtype=torch.long))

    # ------------------------------------------------------------------ building blocks

    def encode(self, features: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Annotation vectors the decoder attends: ``[B,N,C']`` (BiLSTM output if configured)."""
        values = features.to(self.embedding.weight.dtype)
        if mask is not None:
            mask = mask.to(torch.bool)
        if self.encoder is None:
            return values, mask
        b, n, _ = values.shape
        if mask is None:
            out, _ = self.encoder(values)
            return out, mask
        lengths = mask.sum(1).clamp_min(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            values, lengths, batch_first=True, enforce_sorted=False
        )
        out, _ = self.encoder(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=n)
        return out * mask.unsqueeze(-1).to(out.dtype), mask

    def _linears(self, deferred: bool) -> dict[str, Any]:
        """Per-step weight applications (deferred weight gradients in training)."""
        wrap = _DeferredLinear if deferred else (lambda w: lambda x: F.linear(x, w.to(x.dtype)))
        e = self.cfg.embed_dim
        cell0 = self.cells[0]
        return {
            "z": wrap(cell0.weight_ih[:, e:]) if self.uses_context else None,
            "hh": [wrap(cell.weight_hh) for cell in self.cells],
            "ih": [None] + [wrap(cell.weight_ih) for cell in self.cells[1:]],
        }

    def _input_gates(self, x: Tensor) -> Tensor:
        """Layer-0 gate pre-activations from word inputs ``x [...,E]`` (all steps at once)."""
        cell0 = self.cells[0]
        w = cell0.weight_ih[:, : self.cfg.embed_dim]
        return F.linear(x, w, cell0.bias_ih + cell0.bias_hh)

    def _cell_step(
        self,
        x_gates: Tensor,
        z: Tensor | None,
        h: list[Tensor],
        c: list[Tensor],
        lin: dict[str, Any],
    ) -> tuple[list[Tensor], list[Tensor]]:
        """One LSTM step of all layers; ``x_gates [R,4H]`` from ``_input_gates``."""
        new_h, new_c = [], []
        gates = x_gates + lin["hh"][0](h[0])
        if z is not None:
            gates = gates + lin["z"](z)
        hi, ci = _lstm_pointwise(gates, c[0])
        new_h.append(hi)
        new_c.append(ci)
        for i in range(1, len(self.cells)):
            cell = self.cells[i]
            gates = (
                lin["ih"][i](self.dropout(hi)) + lin["hh"][i](h[i]) + cell.bias_ih + cell.bias_hh
            )
            hi, ci = _lstm_pointwise(gates, c[i])
            new_h.append(hi)
            new_c.append(ci)
        return new_h, new_c

    def _initial_hidden(
        self, values: Tensor, mask: Tensor | None
    ) -> tuple[list[Tensor], list[Tensor]]:
        b = values.shape[0]
        L, H = self.cfg.num_layers, self.cfg.hidden_dim
        mean = masked_mean(values, mask)
        if self.init_h is not None and self.init_c is not None:
            h0 = torch.tanh(self.init_h(mean)).reshape(b, L, H)
            c0 = torch.tanh(self.init_c(mean)).reshape(b, L, H)
            return list(h0.unbind(1)), list(c0.unbind(1))
        zeros = values.new_zeros(b, H)
        h, c = [zeros] * L, [zeros] * L
        if self.image_proj is not None:  # show_tell: image is the input at step -1
            x_gates = self._input_gates(self.image_proj(mean))
            h, c = self._cell_step(x_gates, None, h, c, self._linears(deferred=False))
        return h, c

    def _context(
        self,
        h_top: Tensor,
        values: Tensor | None,
        keys: Tensor | None,
        mask: Tensor | None,
        context: Tensor | None,
        mode: str,
        scorer: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """``(z [R,C] | None, alpha [R,N] | None, log p(s) [R] | None)`` for one step.

        ``mode``: ``soft`` (expectation), ``sample`` or ``argmax`` (hard attention).
        ``scorer``: teacher forcing's ``AttentionScorer.step_scorer`` (else ``scores(h, keys)``).
        """
        if not self.uses_context:
            return None, None, None
        if self.attention is None:
            return expand_groups(context, h_top.shape[0]), None, None
        assert keys is not None and values is not None
        e = scorer(h_top) if scorer is not None else self.attention.scores(h_top, keys)
        alpha = masked_softmax(e, mask)
        logp = None
        if mode == "soft":
            z = soft_context(alpha, values)
        else:
            loc = sample_location(alpha) if mode == "sample" else argmax_location(alpha)
            z = hard_context(values, loc)
            if mode == "sample":
                logp = location_log_prob(alpha, loc)
        if self.gate is not None:
            z = z * self.gate(h_top).to(z.dtype)
        return z, alpha, logp

    def _logits(self, emb: Tensor, h: Tensor, z: Tensor | None) -> Tensor:
        """Vocabulary logits for rows of ``emb [*,E]``, ``h [*,H]``, ``z [*,C]``."""
        if self.out_hidden is None:
            return self.out_vocab(self.dropout(h))
        x = h if z is None else torch.cat([h, z.to(h.dtype)], dim=-1)
        return self.out_vocab(self.dropout(emb + self.out_hidden(x)))

    def _test_mode(self) -> str:
        if not self.hard:
            return "soft"
        return "argmax" if self.cfg.test_mode == "argmax" else "soft"

    # ------------------------------------------------------------------ training

    def compute_loss(
        self,
        features: Tensor,
        mask: Tensor | None,
        tokens: Tensor,
        label_smoothing: float = 0.0,
    ) -> dict[str, Tensor]:
        """Teacher-forced loss.

        ``features [B,N,C]``, ``mask [B,N]`` bool | None, ``tokens [B,T+1]`` =
        ``<bos> w1..wT <eos>`` right-padded with ``pad_id``.  Returns ``loss`` (backprop this) =
        ``xe + doubly_stochastic * ds`` (+ for hard attention ``reinforce_weight * reinforce -
        entropy_weight * entropy``), and the parts ``xe`` (masked token cross-entropy incl.
        <eos>, mean over real tokens), ``ds`` (see ``doubly_stochastic_penalty``); hard attention
        adds ``reinforce`` (surrogate, per real token), ``entropy`` (mean attention entropy per
        real step), ``baseline`` (moving-average reward after this batch's update).

        Hard attention in training mode: with probability ``soft_fraction`` the whole batch
        uses the soft expectation (no REINFORCE term, baseline untouched); otherwise
        locations are sampled and the reward is each sequence's log-likelihood
        ``log p(y | s, a)`` of the target caption.  In eval mode ``test_mode`` is used.
        """
        cfg = self.cfg
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        step_mask = targets != self.pad_id  # [B,T]
        lengths = step_mask.sum(1)  # real steps per sequence (words + <eos>)
        t_max = max(int(lengths.max().item()) if lengths.numel() else 0, 1)
        inputs, targets, step_mask = inputs[:, :t_max], targets[:, :t_max], step_mask[:, :t_max]
        steps = torch.arange(t_max, device=lengths.device)
        if not torch.equal(step_mask, steps < lengths.unsqueeze(1)):
            raise ValueError(
                "compute_loss: tokens must be <bos> words <eos> followed only by padding "
                f"(pad_id={self.pad_id}); found padding inside a caption"
            )
        b = tokens.shape[0]

        # Sequences sorted longest first, so the ones still running at step t are a prefix
        # of the batch: step t works on rows [:active[t]] only (what pack_padded_sequence
        # does), no LSTM or attention work on padded steps.  All outputs are batch means.
        order = torch.argsort(lengths, descending=True, stable=True)
        if not torch.equal(order, torch.arange(b, device=order.device)):
            features, inputs, targets = features[order], inputs[order], targets[order]
            step_mask, lengths = step_mask[order], lengths[order]
            mask = mask[order] if mask is not None else None
        active = (lengths.unsqueeze(0) > steps.unsqueeze(1)).sum(1).tolist()  # [T]

        values, mask = self.encode(features, mask)
        keys = self.attention.precompute(values) if self.attention is not None else None
        context = masked_mean(values, mask) if (self.uses_context and keys is None) else None
        h, c = self._initial_hidden(values, mask)

        if self.hard and self.training:
            mode = "soft" if float(torch.rand(())) < cfg.soft_fraction else "sample"
        else:
            mode = self._test_mode()

        emb = self.embedding(inputs)  # [B,T,E] all steps at once
        x_gates = self._input_gates(emb)  # [B,T,4H] word part of layer-0 gates, one matmul
        x_steps = x_gates.unbind(1)  # views; backward is one stack, not T zero-filled copies
        lin = self._linears(deferred=True)
        scorer = self.attention.step_scorer(keys) if self.attention is not None else None
        memory = (values, keys, mask, context)
        hs: list[Tensor] = []
        zs: list[Tensor] = []
        alphas: list[Tensor] = []
        logps: list[Tensor] = []
        for t in range(t_max):
            r = active[t]
            if r < h[0].shape[0]:  # sequences that ended drop out of the batch
                h, c = [x[:r] for x in h], [x[:r] for x in c]
                memory = tuple(None if x is None else x[:r] for x in memory)
            z, alpha, logp = self._context(h[-1], *memory, mode, scorer)
            h, c = self._cell_step(x_steps[t][:r], z, h, c, lin)
            hs.append(h[-1])
            if z is not None:
                zs.append(z)
            if alpha is not None:
                alphas.append(alpha)
            if logp is not None:
                logps.append(logp)

        # one output projection for all real tokens, in time-major order (step 0's rows,
        # then step 1's, ...: the order the loop produced them)
        real_tb = step_mask.t()  # [T,B]
        h_all = torch.cat(hs, 0)  # [M,H]
        z_all = torch.cat(zs, 0) if zs else None
        logits = self._logits(emb.transpose(0, 1)[real_tb], h_all, z_all).float()  # [M,V]
        tgt = targets.t()[real_tb]
        n_tok = tgt.numel()
        nll = F.cross_entropy(logits, tgt, reduction="none")  # [M]
        if label_smoothing > 0:
            xe = F.cross_entropy(logits, tgt, label_smoothing=label_smoothing)
        else:
            xe = nll.mean()

        zero = logits.new_zeros(())
        out: dict[str, Tensor] = {"xe": xe}
        if alphas:
            alpha_all = _pad_rows_and_stack(alphas, b)  # [B,T,N], zeros after each sequence
            ds = doubly_stochastic_penalty(alpha_all, step_mask, mask)
        else:
            alpha_all = None
            ds = zero
        out["ds"] = ds
        loss = xe + cfg.doubly_stochastic * ds if alphas else xe

        if self.hard:
            assert alpha_all is not None
            sm = step_mask.to(logits.dtype)
            entropy = (attention_entropy(alpha_all) * sm).sum() / max(n_tok, 1)
            reinforce = zero
            if logps:
                nll_tb = torch.zeros(t_max, b, dtype=nll.dtype, device=nll.device)
                nll_tb[real_tb] = nll.detach()
                reward = -nll_tb.sum(0)  # [B] log p(y | s, a)
                logp_seq = _pad_rows_and_stack(logps, b).sum(1)  # [B]
                with torch.no_grad():
                    if int(self.reinforce_updates) == 0:  # bias-corrected start
                        baseline = reward.mean()
                    else:
                        baseline = self.reinforce_baseline.float()
                reinforce = reinforce_surrogate(logp_seq, reward, baseline, max(n_tok, 1))
                with torch.no_grad():
                    new_b = update_baseline(baseline, reward, cfg.baseline_decay)
                    self.reinforce_baseline.copy_(new_b)
                    self.reinforce_updates += 1
            loss = loss + cfg.reinforce_weight * reinforce - cfg.entropy_weight * entropy
            out["reinforce"] = reinforce
            out["entropy"] = entropy.detach()
            out["baseline"] = self.reinforce_baseline.detach().clone().float()
        out["loss"] = loss
        return out

    def compute_loss_static(
        self,
        features: Tensor,
        mask: Tensor | None,
        tokens: Tensor,
        label_smoothing: float = 0.0,
    ) -> dict[str, Tensor]:
        """``compute_loss`` on a fixed-shape schedule, for ``torch.compile`` and CUDA graphs.

        Same inputs and the same ``loss``, ``xe``, ``ds`` (up to float rounding; with dropout
        the random masks differ).  Every step runs all ``B`` rows for ``T = tokens.shape[1] - 1``
        steps and the loss masks what lies after each ``<eos>``, so every shape follows from
        ``tokens.shape`` and nothing is read back to the host (the padding layout is not
        checked either).  More arithmetic than ``compute_loss`` (the padded steps run), but a
        graph that compiles whole (``fullgraph=True``): on a GPU, where a decoder step's kernels
        are too small to hide their launch cost, ``torch.compile(...,
        mode="reduce-overhead")`` replays the whole loss from CUDA graphs.  On a CPU
        ``compute_loss`` is faster.  Hard attention is not supported (it samples its training
        mode and updates the REINFORCE baseline on the host).
        """
        if self.hard:
            raise ConfigError(
                "compute_loss_static: hard_attention decides soft/sampled batches and updates "
                "its REINFORCE baseline on the host; use compute_loss"
            )
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        step_mask = targets != self.pad_id  # [B,T]
        values, mask = self.encode(features, mask)
        keys = self.attention.precompute(values) if self.attention is not None else None
        context = masked_mean(values, mask) if (self.uses_context and keys is None) else None
        h, c = self._initial_hidden(values, mask)
        lin = self._linears(deferred=False)
        emb = self.embedding(inputs)  # [B,T,E]
        x_gates = self._input_gates(emb)  # [B,T,4H]
        hs: list[Tensor] = []
        zs: list[Tensor] = []
        alphas: list[Tensor] = []
        for t in range(inputs.shape[1]):
            z, alpha, _ = self._context(h[-1], values, keys, mask, context, "soft")
            h, c = self._cell_step(x_gates[:, t], z, h, c, lin)
            hs.append(h[-1])
            if z is not None:
                zs.append(z)
            if alpha is not None:
                alphas.append(alpha)
        z_all = torch.stack(zs, 1) if zs else None
        logits = self._logits(emb, torch.stack(hs, 1), z_all).float().flatten(0, 1)  # [B*T,V]
        flat_targets = targets.flatten()
        if label_smoothing > 0:
            xe = F.cross_entropy(
                logits, flat_targets, ignore_index=self.pad_id, label_smoothing=label_smoothing
            )
        else:
            nll = F.cross_entropy(logits, flat_targets, ignore_index=self.pad_id, reduction="sum")
            xe = nll / step_mask.sum().clamp_min(1)
        out: dict[str, Tensor] = {"xe": xe}
        if alphas:
            ds = doubly_stochastic_penalty(torch.stack(alphas, 1), step_mask, mask)
            out["ds"] = ds
            out["loss"] = xe + self.cfg.doubly_stochastic * ds
        else:
            out["ds"] = logits.new_zeros(())
            out["loss"] = xe
        return out

    # ------------------------------------------------------------------ inference

    def init_state(self, features: Tensor, mask: Tensor | None) -> DecoderState:
        """State before the first word: memory (values, keys once, mask) and ``h0``/``c0``."""
        values, mask = self.encode(features, mask)
        keys = self.attention.precompute(values) if self.attention is not None else None
        context = masked_mean(values, mask) if (self.uses_context and keys is None) else None
        h, c = self._initial_hidden(values, mask)
        return DecoderState(
            h=torch.stack(h, 0),
            c=torch.stack(c, 0),
            values=values if self.attention is not None else None,
            keys=keys,
            mask=mask,
            context=context,
            group=1,
        )

    def step(
        self, prev_tokens: Tensor, state: DecoderState
    ) -> tuple[Tensor, Tensor | None, DecoderState]:
        """One decoding step: ``prev_tokens [R]`` -> ``(log_probs [R,V] float32, alpha [R,N] | None, state)``.

        Hard attention uses ``test_mode`` (argmax location or expectation); the returned
        ``alpha`` is always the attention distribution.
        """
        emb = self.embedding(prev_tokens)
        h, c = list(state.h.unbind(0)), list(state.c.unbind(0))
        z, alpha, _ = self._context(
            h[-1], state.values, state.keys, state.mask, state.context, self._test_mode()
        )
        h, c = self._cell_step(self._input_gates(emb), z, h, c, self._linears(deferred=False))
        logits = self._logits(emb, h[-1], z)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return log_probs, alpha, replace(state, h=torch.stack(h, 0), c=torch.stack(c, 0))
