"""Show, Attend and Tell (Xu et al. 2015) and its LSTM baselines: the model.

``model.name=lstm``; ``variant`` picks the model, the rest is one code path:

- ``soft_attention`` (Xu et al. 2015 Sec. 4.2; Bahdanau et al. 2014; Yao et al. 2015 over frames);
- ``hard_attention`` (Xu et al. Sec. 4.1): ``z_t = beta_t a_{s_t}``, ``s_t ~ alpha_t``;
- ``mean_pool`` (Venugopalan et al. 2015): the fixed context ``z = mean_i a_i`` at every step;
- ``show_tell`` (Vinyals et al. 2015): the mean annotation, projected to the word size, is the
  LSTM's input at step ``-1``; no context afterwards.

Step ``t`` reads ``y_{t-1}`` and ``h_{t-1}`` (equation numbers of Xu et al.):

    e_ti    = f_att(a_i, h_{t-1})                 (4)  additive | dot | general: ``attention.py``
    alpha_t = softmax(e_t) over the real positions (5)
    z_t     = beta_t sum_i alpha_ti a_i            (6, 13; hard: (8, 9) z_t = beta_t a_{s_t})
    beta_t  = sigmoid(f_beta(h_{t-1}))                  the gate of Sec. 4.2.1: ``SelectorGate``
    h_t,c_t = LSTM([E y_{t-1}; z_t], h_{t-1}, c_{t-1})  (1-3)
    p(y_t)  = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))   (7, the deep output)
    h_0,c_0 = tanh(f_init(mean_i a_i))

The annotation vectors ``a_i`` are the features, optionally re-encoded by a BiLSTM over the N
positions (Bahdanau's encoder; order-aware frames), with a residual against the clip's centre and,
for the attending variants, a position/time code (``captioning.models.positions``).

Two implementations of the step, equal in values and gradients (``tests/test_lstm_step.py``):

- ``plain_step``, the reference: the equations above with the modules that hold them
  (``self.attention`` scores, normalises and averages; ``self.gate``; one ``nn.LSTMCell`` per layer);
- ``FastStep``, what training and decoding run (``model.fast_step=true``): every use of ``h_{t-1}``
  (the attention's query, the gate, the top layer's recurrent gates) is ONE product, the input
  words' gates come in for all steps at once, and the weights are concatenated and cast once per
  batch instead of once per step.  It reads the modules' weights, so a change of the attention or
  the gate is a change of ``plain_step``; set ``model.fast_step=false`` to train the modules as
  written until the fast path follows.

Precision, one rule (``precision``): autocast as the caller set it, except on a CPU without native
low-precision products, where the decoder computes in float32 (emulated bf16 is 8-10x slower
there, docs/benchmarks.md).  Inside the step loop autocast is off and the fast step's weights and
the memory are cast once to the dtype autocast would use (``compute_dtype``).

Teacher forcing and the loss of eq. 14 are ``captioning.models.decoders.lstm_forcing``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.models.attention import (
    SelectorGate,
    argmax_location,
    build_attention,
    expand_groups,
    hard_context,
    location_log_prob,
    masked_mean,
    masked_softmax,
    sample_location,
)
from captioning.models.decoders import register_decoder
from captioning.models.decoders.base import CaptionDecoder, DecoderState
from captioning.models.decoders.lstm_forcing import (
    FastStep,
    PlainStep,
    autocast_off,
    compute_dtype,
    precision,
    teacher_forcing,
)
from captioning.models.positions import CODES, MODES, PositionCode, build_position_code
from captioning.models.residual import CENTRES, Residual

__all__ = ["LSTMConfig", "LSTMDecoder", "VARIANTS"]

VARIANTS = ("show_tell", "mean_pool", "soft_attention", "hard_attention")
SCORINGS = ("additive", "dot", "general")
TEST_MODES = ("argmax", "expectation")


@dataclass
class LSTMConfig:
    """Hyper-parameters of the LSTM decoders (``conf/model/{soft,hard,temporal}_attention|...``)."""

    name: str = "lstm"
    variant: str = "soft_attention"  # show_tell | mean_pool | soft_attention | hard_attention
    scoring: str = "additive"  # additive | dot (h.a, equal sizes) | general (h^T W a)
    embed_dim: int = 256
    hidden_dim: int = 512
    attention_dim: int = 256
    num_layers: int = 1
    dropout: float = 0.3
    init_from_mean: bool = True  # h0/c0 = tanh(MLP(mean annotation)); show_tell: image is x_{-1}
    gate: bool = True  # Xu's selector beta = sigmoid(W_beta h)
    deep_output: bool = True  # L_o(E y_{t-1} + L_h h_t + L_z z_t)
    bidirectional_encoder: bool = False  # BiLSTM over the N positions (frames) before attention
    position_code: str = "none"  # none | sinusoidal | learned: where/when code of each a_i
    position_mode: str = "concat"  # concat [a_i; p_i] | add a_i + p_i
    position_dim: int = 64  # channels of a concatenated code
    residual: str = "none"  # none | median | mean: attend over [a_i ; (a_i - centre) / sigma] (residual.py)
    # lambda of eq. 14, against the caption's SUMMED NLL; 0 by default (docs/findings.md: lambda = 1 keeps
    # coverage near uniform and costs pointing); experiment=xu2015_soft sets the paper's 1
    doubly_stochastic: float = 0.0
    # hard attention
    soft_fraction: float = 0.5  # share of training batches that use the soft expectation
    entropy_weight: float = 0.01
    baseline_decay: float = 0.9
    reinforce_weight: float = 1.0
    test_mode: str = "argmax"  # argmax | expectation
    fast_step: bool = True  # FastStep (one product of h_{t-1}); false: plain_step, the modules as written

    def validate(self) -> LSTMConfig:
        """Raise ``ConfigError`` naming the bad key; returns ``self``."""
        choices = {"variant": VARIANTS, "scoring": SCORINGS, "test_mode": TEST_MODES, "position_code": CODES,
                   "position_mode": MODES, "residual": ("none", *CENTRES)}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} is not one of {list(allowed)}; "
                                  f"set it to one of those")
        for key in ("embed_dim", "hidden_dim", "attention_dim", "num_layers", "position_dim"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"model.{key} must be >= 1 (got {getattr(self, key)})")
        for key in ("dropout", "soft_fraction", "baseline_decay"):
            if not 0.0 <= float(getattr(self, key)) <= 1.0:
                raise ConfigError(f"model.{key} must be in [0, 1] (got {getattr(self, key)})")
        if self.doubly_stochastic < 0:
            raise ConfigError(f"model.doubly_stochastic must be >= 0 (got {self.doubly_stochastic})")
        if self.bidirectional_encoder and self.hidden_dim < 2:
            raise ConfigError("model.hidden_dim must be >= 2 with bidirectional_encoder")
        return self


# ----------------------------------------------------------------------------- the model


@register_decoder("lstm")
class LSTMDecoder(CaptionDecoder):
    """The four variants of the module docstring; ``features [M,N,C]``, ``mask [M,N]`` bool | None.

    With ``bidirectional_encoder`` the mask must mark a prefix of real positions (as frames do).
    """

    Config = LSTMConfig

    def __init__(self, cfg: LSTMConfig, vocab_size: int, feature_dim: int,
                 layout: tuple[int, ...] | None = None, pad_id: int = 0) -> None:
        super().__init__(cfg, vocab_size, feature_dim, layout, pad_id)
        E, H, L = cfg.embed_dim, cfg.hidden_dim, cfg.num_layers
        attends = cfg.variant in ("soft_attention", "hard_attention")
        self.has_attention = attends
        self.hard = cfg.variant == "hard_attention"
        self.hard_attention = self.hard and cfg.test_mode == "argmax"
        # one graph under torch.compile: not hard attention (it decides soft/sampled batches and updates its
        # baseline on the host), nor the BiLSTM encoder (packed sequences; dynamo does not trace nn.LSTM)
        self.compilable = not self.hard and not cfg.bidirectional_encoder
        self.uses_context = cfg.variant != "show_tell"

        self.embedding = nn.Embedding(self.vocab_size, E, padding_idx=self.pad_id)  # E
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        with torch.no_grad():
            self.embedding.weight[self.pad_id].zero_()
        if cfg.bidirectional_encoder:
            self.encoder: nn.LSTM | None = nn.LSTM(feature_dim, H // 2, batch_first=True, bidirectional=True)
            enc_dim = 2 * (H // 2)
        else:
            self.encoder = None
            enc_dim = feature_dim
        self.residual = Residual(enc_dim, cfg.residual) if (attends and cfg.residual != "none") else None
        att_in = 2 * enc_dim if self.residual is not None else enc_dim
        self.position: PositionCode | None = None
        if attends:
            self.position = build_position_code(self.layout, att_in, cfg.position_code, cfg.position_mode,
                                                cfg.position_dim)
        ctx_dim = self.position.out_dim if self.position is not None else att_in
        self.context_dim = ctx_dim
        self.attention = build_attention(cfg.scoring, H, ctx_dim, cfg.attention_dim) if attends else None  # f_att
        self.gate = SelectorGate(H) if (attends and cfg.gate) else None  # f_beta
        in0 = E + (ctx_dim if self.uses_context else 0)
        self.cells = nn.ModuleList([nn.LSTMCell(in0 if i == 0 else H, H) for i in range(L)])
        self.image_proj = nn.Linear(enc_dim, E) if cfg.variant == "show_tell" else None
        if cfg.variant != "show_tell" and cfg.init_from_mean:
            self.init_h: nn.Linear | None = nn.Linear(enc_dim, L * H)  # f_init,h
            self.init_c: nn.Linear | None = nn.Linear(enc_dim, L * H)  # f_init,c
        else:
            self.init_h = self.init_c = None
        self.dropout = nn.Dropout(cfg.dropout)
        if cfg.deep_output:  # [L_h ; L_z] as one linear layer on [h_t ; z_t], then L_o
            self.out_hidden: nn.Linear | None = nn.Linear(H + (ctx_dim if self.uses_context else 0), E)
            self.out_vocab = nn.Linear(E, self.vocab_size)
        else:
            self.out_hidden = None
            self.out_vocab = nn.Linear(H, self.vocab_size)
        # hard attention: moving-average baseline of the reward and how often it was updated
        self.register_buffer("reinforce_baseline", torch.zeros(()))
        self.register_buffer("reinforce_updates", torch.zeros((), dtype=torch.long))

    @classmethod
    def run_tag(cls, cfg: LSTMConfig) -> str:
        return f"{cfg.variant}-{cfg.scoring}"

    @classmethod
    def examples(cls) -> list[dict[str, Any]]:
        small = {"name": "lstm", "embed_dim": 16, "hidden_dim": 24, "attention_dim": 8, "dropout": 0.0}
        return [
            {**small, "variant": "show_tell"},
            {**small, "variant": "mean_pool"},
            {**small, "variant": "soft_attention"},
            {**small, "variant": "soft_attention", "scoring": "general", "num_layers": 2,
             "position_code": "sinusoidal", "bidirectional_encoder": True},
            {**small, "variant": "hard_attention", "position_code": "learned", "position_mode": "add"},
            {**small, "variant": "soft_attention", "position_code": "sinusoidal", "residual": "median"},
        ]

    # ------------------------------------------------------------------ annotation vectors

    def _encode(self, features: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Features, BiLSTM-encoded if configured: ``[M,N,C']`` (padding zeroed)."""
        values = features.to(self.embedding.weight.dtype)
        mask = None if mask is None else mask.to(torch.bool)
        if self.encoder is None:
            return values, mask
        if mask is None:
            return self.encoder(values)[0], mask
        lengths = mask.sum(1).clamp_min(1).cpu()  # pack_padded_sequence wants them on the host
        packed = nn.utils.rnn.pack_padded_sequence(values, lengths, batch_first=True, enforce_sorted=False)
        out, _ = nn.utils.rnn.pad_packed_sequence(self.encoder(packed)[0], batch_first=True,
                                                  total_length=values.shape[1])
        return out * mask.unsqueeze(-1).to(out.dtype), mask

    def memory(self, features: Tensor, mask: Tensor | None) -> tuple[dict[str, Tensor | None], Tensor]:
        """What every step reads, computed ONCE per item: the annotation vectors ``values`` a_i, the
        attention's ``keys`` (e.g. ``U_a a_i``), the ``mask``, mean_pool's fixed ``context``; and the
        mean annotation ``[M,C']`` for ``h_0, c_0``."""
        encoded, mask = self._encode(features, mask)
        mean = masked_mean(encoded, mask)
        memory: dict[str, Tensor | None] = {"values": None, "keys": None, "mask": mask, "context": None}
        if self.attention is not None:
            values = encoded
            if self.residual is not None:
                values = torch.cat([values, self.residual(values, mask)], -1)
            values = self.position(values) if self.position is not None else values
            memory["values"], memory["keys"] = values, self.attention.precompute(values)
        elif self.uses_context:
            memory["context"] = mean
        return memory, mean

    def initial_state(self, mean: Tensor, step: Any) -> tuple[list[Tensor], list[Tensor]]:
        """``h_0, c_0 = tanh(f_init(mean_i a_i))`` per layer ``[M,H]`` in the ``step``'s dtype; show_tell
        feeds the image at step -1."""
        dtype = step.dtype
        m, L, H = mean.shape[0], self.cfg.num_layers, self.cfg.hidden_dim
        if self.init_h is not None and self.init_c is not None:
            h0 = torch.tanh(self.init_h(mean)).reshape(m, L, H).to(dtype)
            c0 = torch.tanh(self.init_c(mean)).reshape(m, L, H).to(dtype)
            return list(h0.unbind(1)), list(c0.unbind(1))
        zeros = mean.new_zeros(m, H, dtype=dtype)
        h, c = [zeros] * L, [zeros] * L
        if self.image_proj is not None:
            with autocast_off(mean.device):
                h, c, *_ = step(step.word_gates(self.image_proj(mean)), h, c, {}, "soft")
        return h, c

    def logits(self, words: Tensor, h: Tensor, z: Tensor | None) -> Tensor:
        """Vocabulary logits (eq. 7) from ``E y_{t-1} [*,E]``, ``h_t [*,H]``, ``z_t [*,C]``."""
        if self.out_hidden is None:
            return self.out_vocab(self.dropout(h))
        x = h if z is None else torch.cat([h, z.to(h.dtype)], dim=-1)
        return self.out_vocab(self.dropout(words + self.out_hidden(x)))

    # ------------------------------------------------------------------ the step, plain (the reference)

    def plain_step(self, word: Tensor, h: list[Tensor], c: list[Tensor], memory: dict[str, Tensor | None],
                   mode: str) -> tuple[list[Tensor], list[Tensor], Tensor | None, Tensor | None, Tensor | None]:
        """Eqs. 1-6, 8-9 and 13 with the modules as written: ``word`` = ``E y_{t-1} [R,E]``, ``h, c``
        per layer ``[R,H]``, ``memory`` of ``M`` items (``R`` a multiple of ``M``: rows ``g*G ..``
        read item ``g``) -> ``(h, c, z [R,C] | None, alpha [R,N] | None, log p(s_t) [R] | None)``.
        ``mode``: ``soft``, or hard attention's ``sample`` | ``argmax``."""
        z = alpha = logp = None
        query = h[-1]
        if self.attention is not None:
            keys, values, mask = memory["keys"], memory["values"], memory["mask"]
            assert keys is not None and values is not None
            if mode == "soft":
                z, alpha = self.attention(query, keys, values, mask)  # (4)-(6), (13)
            else:
                alpha = masked_softmax(self.attention.scores(query, keys), mask)
                loc = sample_location(alpha) if mode == "sample" else argmax_location(alpha)  # (8)
                z = hard_context(values, loc)  # (9)
                logp = location_log_prob(alpha, loc) if mode == "sample" else None
            if self.gate is not None:
                z = self.gate(query) * z
        elif self.uses_context:
            z = expand_groups(memory["context"], query.shape[0])
        x = word if z is None else torch.cat([word, z.to(word.dtype)], -1)
        new_h, new_c = [], []
        for i, cell in enumerate(self.cells):  # (1)-(3)
            hi, ci = cell(x if i == 0 else self.dropout(new_h[-1]), (h[i], c[i]))
            new_h.append(hi)
            new_c.append(ci)
        return new_h, new_c, z, alpha, logp

    def step_function(self, dtype: torch.dtype) -> Any:
        """What runs one step: a ``FastStep`` (weights cast to ``dtype`` once), or ``plain_step``
        with ``model.fast_step=false`` (the modules' own weights and dtype)."""
        return FastStep(self, dtype) if self.cfg.fast_step else PlainStep(self)

    def test_mode(self) -> str:
        """Hard attention's context at test time (``test_mode``); soft otherwise."""
        return "argmax" if self.hard_attention else "soft"

    # ------------------------------------------------------------------ inference

    def init_state(self, features: Tensor, mask: Tensor | None) -> DecoderState:
        with precision(features.device):
            memory, mean = self.memory(features, mask)
            step = self.step_function(compute_dtype(self.cells[0].weight_ih))
            memory = step.prepare(memory, static=torch.compiler.is_compiling())  # no host read in a graph
            h, c = self.initial_state(mean, step)
        return DecoderState({"h": torch.stack(h, 1), "c": torch.stack(c, 1)}, memory, shared={"step": step})

    def step(self, prev_tokens: Tensor, state: DecoderState) -> tuple[Tensor, Tensor | None, DecoderState]:
        """``prev_tokens [R]`` -> ``(log_probs [R,V] float32, alpha [R,N] | None, state)``; hard
        attention uses ``test_mode`` and returns the distribution ``alpha``."""
        step = state.shared["step"]
        with precision(prev_tokens.device):
            words = self.embedding(prev_tokens)
            with autocast_off(words.device):
                h, c = list(state.rows["h"].unbind(1)), list(state.rows["c"].unbind(1))
                h, c, z, alpha, _ = step(step.word_gates(words), h, c, state.memory, self.test_mode())
            log_probs = torch.log_softmax(self.logits(words, h[-1], z).float(), dim=-1)
        return log_probs, alpha, state.with_rows(h=torch.stack(h, 1), c=torch.stack(c, 1))

    # ------------------------------------------------------------------ training

    def compute_loss(self, features: Tensor, mask: Tensor | None, tokens: Tensor, label_smoothing: float = 0.0,
                     static: bool = False, lengths: list[int] | None = None) -> dict[str, Tensor]:
        """Teacher-forced loss of ``tokens [R,T+1]`` (``<bos> w1..wT <eos>`` right-padded) over
        ``features [M,N,C]`` (``R`` a multiple of ``M``: rows ``g*G .. g*G+G-1`` are item ``g``'s
        captions, its annotation vectors projected once for all of them).

        ``lengths``: each caption's real steps (words + <eos>) when the caller knows them on the host
        (the loader does), so nothing is read back; None: read from ``tokens`` and checked.  Returns
        ``loss`` (backprop this; per token), ``xe``, ``ds`` (per caption) and, for hard attention,
        ``reinforce``, ``entropy``, ``baseline`` (``lstm_forcing.teacher_forcing``).
        ``static=True``: every row runs every step, nothing read back: one graph for
        ``torch.compile`` (not for hard attention)."""
        if static and self.hard:
            raise ConfigError("compute_loss(static=True): hard_attention decides soft/sampled batches and "
                              "updates its REINFORCE baseline on the host; use the packed schedule")
        with precision(features.device):
            return teacher_forcing(self, features, mask, tokens, label_smoothing, static, lengths)
