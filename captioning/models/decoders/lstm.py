"""LSTM decoders over N annotation vectors: Show, Attend and Tell and its baselines.

``model.name=lstm``, one code path switched by ``variant``:

- ``show_tell`` (Vinyals et al. 2015): the mean annotation, projected to the word size, is the
  LSTM's input at step ``-1``; no context afterwards.
- ``mean_pool`` (Venugopalan et al. 2015): the fixed context ``z = mean_i a_i`` at every step.
- ``soft_attention`` (Xu et al. 2015; Bahdanau et al. 2014; Yao et al. 2015 over frames).
- ``hard_attention`` (Xu et al. 2015 Sec. 4.1): ``z_t = beta_t a_{s_t}``, ``s_t ~ alpha_t``.

Step ``t`` reads ``y_{t-1}`` and ``h_{t-1}`` (Xu et al., eqs. 1-7 and Sec. 3.1.2):

    e_ti    = f_att(a_i, h_{t-1})                 additive | dot | general (attention.py)
    alpha_t = softmax(e_t) over the real positions
    z_t     = beta_t sum_i alpha_ti a_i,  beta_t = sigmoid(f_beta(h_{t-1}))     (gate)
    h_t,c_t = LSTM([E y_{t-1}; z_t], h_{t-1}, c_{t-1})
    p(y_t)  = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))                    (deep output)
    h_0,c_0 = tanh(f_init(mean_i a_i))

The annotation vectors ``a_i`` are the features, optionally re-encoded by a BiLSTM over the N
positions (Bahdanau's encoder; order-aware frames) and, for the attending variants, with a
position/time code (``captioning.models.positions``) so attention knows where and when.

Loss (eq. 14), per caption: ``-sum_t log p(y_t) + lambda sum_i (1 - sum_t alpha_ti)^2``.  The
batch loss is the sum over captions divided by the number of tokens, so ``loss`` reads per token
(like ``xe``) while lambda weighs the regulariser against the caption's summed log-likelihood as
in the paper (and in arctic-captions); ``ds`` is logged per caption.

One step (``lstm_step.LSTMStep``: every use of ``h_{t-1}`` in one product, the weights cast once)
serves teacher forcing and decoding alike.  Teacher forcing (``lstm_forcing``) runs the loop only
over the captions still running at each step (the batch sorted by length: what
``pack_padded_sequence`` does), or with ``static=True`` over every row at every step (fixed
shapes, one graph for ``torch.compile``).  ``fused_kernels=true`` runs its products and scores
through ``captioning.models.kernels`` (the same numbers, less activation memory; no faster, so
``auto`` leaves them off: ``kernels.use_kernels``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.models import kernels
from captioning.models.attention import SelectorGate, build_attention, masked_mean
from captioning.models.decoders import lstm_forcing as forcing
from captioning.models.decoders import register_decoder
from captioning.models.decoders.base import CaptionDecoder, DecoderState
from captioning.models.decoders.lstm_step import LSTMStep, precision, score_mask
from captioning.models.positions import CODES, MODES, PositionCode, build_position_code
from captioning.models.residual import CENTRES, Residual

__all__ = ["LSTMConfig", "LSTMDecoder", "VARIANTS"]

VARIANTS = ("show_tell", "mean_pool", "soft_attention", "hard_attention")
SCORINGS = ("additive", "dot", "general")
TEST_MODES = ("argmax", "expectation")
KERNELS = ("auto", "true", "false")


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
    # teacher forcing through captioning.models.kernels: auto (= false: they no longer make a step
    # faster, measured, kernels.use_kernels) | true (their memory saving on a CPU) | false
    fused_kernels: str = "auto"

    def validate(self) -> LSTMConfig:
        """Raise ``ConfigError`` naming the bad key; returns ``self``."""
        self.fused_kernels = str(self.fused_kernels).lower()  # a bool in older checkpoints: true | false
        choices = {"variant": VARIANTS, "scoring": SCORINGS, "test_mode": TEST_MODES, "fused_kernels": KERNELS,
                   "position_code": CODES, "position_mode": MODES, "residual": ("none", *CENTRES)}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} is not one of {list(allowed)}; "
                                  f"set it to one of those")
        for key in ("embed_dim", "hidden_dim", "attention_dim", "num_layers", "position_dim"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"model.{key} must be >= 1 (got {getattr(self, key)})")
        for key in ("dropout", "soft_fraction", "baseline_decay"):
            v = float(getattr(self, key))
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"model.{key} must be in [0, 1] (got {v})")
        if self.doubly_stochastic < 0:
            raise ConfigError(f"model.doubly_stochastic must be >= 0 (got {self.doubly_stochastic})")
        if self.bidirectional_encoder and self.hidden_dim < 2:
            raise ConfigError("model.hidden_dim must be >= 2 with bidirectional_encoder")
        return self


@register_decoder("lstm")
class LSTMDecoder(CaptionDecoder):
    """The four variants of the module docstring; ``features [B,N,C]``, ``mask [B,N]`` bool | None.

    With ``bidirectional_encoder`` the mask must mark a prefix of real positions (as frame
    features do).
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
        # one graph under torch.compile: not hard attention (it samples on the host), nor the BiLSTM
        # encoder (packed sequences; dynamo does not trace nn.LSTM)
        self.compilable = not self.hard and not cfg.bidirectional_encoder
        self.uses_context = cfg.variant != "show_tell"

        self.embedding = nn.Embedding(self.vocab_size, E, padding_idx=self.pad_id)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        with torch.no_grad():
            self.embedding.weight[self.pad_id].zero_()

        # annotation vectors a_i: features, BiLSTM-encoded if configured, + position code
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

        self.attention = build_attention(cfg.scoring, H, ctx_dim, cfg.attention_dim) if attends else None
        self.gate = SelectorGate(H) if (attends and cfg.gate) else None
        in0 = E + (ctx_dim if self.uses_context else 0)
        self.cells = nn.ModuleList([nn.LSTMCell(in0 if i == 0 else H, H) for i in range(L)])
        self.image_proj = nn.Linear(enc_dim, E) if cfg.variant == "show_tell" else None
        if cfg.variant != "show_tell" and cfg.init_from_mean:
            self.init_h: nn.Linear | None = nn.Linear(enc_dim, L * H)
            self.init_c: nn.Linear | None = nn.Linear(enc_dim, L * H)
        else:
            self.init_h = self.init_c = None
        self.dropout = nn.Dropout(cfg.dropout)
        if cfg.deep_output:  # [L_h ; L_z] as one linear layer on [h_t ; z_t]
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
        """Features, BiLSTM-encoded if configured: ``[B,N,C']`` (padding zeroed)."""
        values = features.to(self.embedding.weight.dtype)
        if mask is not None:
            mask = mask.to(torch.bool)
        if self.encoder is None:
            return values, mask
        if mask is None:
            return self.encoder(values)[0], mask
        n = values.shape[1]
        lengths = mask.sum(1).clamp_min(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(values, lengths, batch_first=True, enforce_sorted=False)
        out, _ = nn.utils.rnn.pad_packed_sequence(self.encoder(packed)[0], batch_first=True, total_length=n)
        return out * mask.unsqueeze(-1).to(out.dtype), mask

    def _memory(self, features: Tensor, mask: Tensor | None) -> tuple[dict[str, Tensor | None], Tensor]:
        """What every step reads (``values`` a_i, ``keys`` = attention keys computed ONCE,
        ``mask``, mean_pool's fixed ``context``) and the mean annotation for ``h_0``."""
        encoded, mask = self._encode(features, mask)
        mean = masked_mean(encoded, mask)
        memory: dict[str, Tensor | None] = {"values": None, "keys": None, "mask": mask, "context": None}
        if self.attention is not None:
            values = encoded
            if self.residual is not None:
                values = torch.cat([values, self.residual(values, mask)], -1)
            values = self.position(values) if self.position is not None else values
            memory["values"] = values
            memory["keys"] = self.attention.precompute(values)
        elif self.uses_context:
            memory["context"] = mean
        return memory, mean

    def _prepare(self, features: Tensor, mask: Tensor | None, static: bool, forcing: bool = False
                 ) -> tuple[LSTMStep, dict[str, Tensor | None], list[Tensor], list[Tensor]]:
        """The step (weights prepared once; for packed teacher ``forcing`` with the CPU kernels
        when ``kernels.use_kernels`` says so), the memory in the step's dtype with the attention's
        mask bias, and ``h_0, c_0``."""
        memory, mean = self._memory(features, mask)
        fused = forcing and kernels.use_kernels(self.cfg.fused_kernels)
        step = LSTMStep(self, deferred=fused, keys=memory["keys"] if fused else None)
        for key in ("values", "keys", "context"):
            memory[key] = step.cast(memory[key])
        if self.attention is not None:
            memory["bias"], memory["keep"] = score_mask(memory["mask"], static)
        h, c = self._initial_state(mean, step)
        return step, memory, h, c

    def _initial_state(self, mean: Tensor, step: LSTMStep) -> tuple[list[Tensor], list[Tensor]]:
        """``h_0, c_0 = tanh(f_init(mean_i a_i))`` in the step's dtype; show_tell feeds the image at step -1."""
        b = mean.shape[0]
        L, H = self.cfg.num_layers, self.cfg.hidden_dim
        if self.init_h is not None and self.init_c is not None:
            h0 = torch.tanh(self.init_h(mean)).reshape(b, L, H).to(step.dtype)
            c0 = torch.tanh(self.init_c(mean)).reshape(b, L, H).to(step.dtype)
            return list(h0.unbind(1)), list(c0.unbind(1))
        zeros = mean.new_zeros(b, H, dtype=step.dtype)
        h, c = [zeros] * L, [zeros] * L
        if self.image_proj is not None:
            with forcing.no_autocast(mean.device):
                h, c, *_ = step(step.word_gates(self.image_proj(mean)), h, c, {}, "soft")
        return h, c

    def _logits(self, words: Tensor, h: Tensor, z: Tensor | None) -> Tensor:
        """Vocabulary logits from ``E y_{t-1} [*,E]``, ``h_t [*,H]``, ``z_t [*,C]``."""
        if self.out_hidden is None:
            return self.out_vocab(self.dropout(h))
        x = h if z is None else torch.cat([h, z.to(h.dtype)], dim=-1)
        return self.out_vocab(self.dropout(words + self.out_hidden(x)))

    def _test_mode(self) -> str:
        if not self.hard:
            return "soft"
        return "argmax" if self.cfg.test_mode == "argmax" else "soft"

    # ------------------------------------------------------------------ inference

    def init_state(self, features: Tensor, mask: Tensor | None) -> DecoderState:
        with precision(features.device):  # no host read inside a compiled graph (fixed-shape SCST decoding)
            step, memory, h, c = self._prepare(features, mask, static=torch.compiler.is_compiling())
        return DecoderState({"h": torch.stack(h, 1), "c": torch.stack(c, 1)}, memory, shared={"step": step})

    def step(self, prev_tokens: Tensor, state: DecoderState) -> tuple[Tensor, Tensor | None, DecoderState]:
        """``prev_tokens [R]`` -> ``(log_probs [R,V] float32, alpha [R,N] | None, state)``.

        Hard attention uses ``test_mode``; the returned ``alpha`` is always the distribution.
        """
        lstm = state.shared["step"]
        with precision(prev_tokens.device):
            words = self.embedding(prev_tokens)
            with forcing.no_autocast(words.device):
                h, c = list(state.rows["h"].unbind(1)), list(state.rows["c"].unbind(1))
                h, c, z, alpha, _ = lstm(lstm.word_gates(words), h, c, state.memory, self._test_mode())
            log_probs = torch.log_softmax(self._logits(words, h[-1], z).float(), dim=-1)
        return log_probs, alpha, state.with_rows(h=torch.stack(h, 1), c=torch.stack(c, 1))

    # ------------------------------------------------------------------ training

    def compute_loss(self, features: Tensor, mask: Tensor | None, tokens: Tensor,
                     label_smoothing: float = 0.0, static: bool = False) -> dict[str, Tensor]:
        """Teacher-forced loss of ``tokens [B,T+1]`` = ``<bos> w1..wT <eos>`` right-padded.

        Returns ``loss`` (backprop this; per token, see the module docstring), ``xe`` (token
        cross-entropy incl. <eos>, mean over real tokens), ``ds`` (regulariser per caption);
        hard attention adds ``reinforce`` (surrogate, per token), ``entropy`` (mean attention
        entropy per real step) and ``baseline`` (moving-average reward after this batch).

        ``static=True``: every row runs every step and the loss masks what lies after each
        <eos>, so all shapes follow from ``tokens.shape`` and nothing is read back to the host
        (padding layout not checked): one graph for ``torch.compile``.  Not for hard attention.

        Hard attention in training mode: with probability ``soft_fraction`` the batch uses the
        soft expectation (no REINFORCE term, baseline untouched); otherwise locations are
        sampled, and each caption's reward is its MEAN token log-likelihood ``log p(y_t | s, a)``
        (arctic-captions' per-token cost: the advantage does not track caption length), against
        a moving-average baseline of that reward.
        """
        if static and self.hard:
            raise ConfigError("compute_loss(static=True): hard_attention decides soft/sampled batches and "
                              "updates its REINFORCE baseline on the host; use the packed schedule")
        with precision(features.device):
            return self._teacher_forcing(features, mask, tokens, label_smoothing, static)

    def _teacher_forcing(self, features: Tensor, mask: Tensor | None, tokens: Tensor, label_smoothing: float,
                         static: bool) -> dict[str, Tensor]:
        sched = forcing.schedule(features, mask, tokens, self.pad_id, static)
        step, memory, h, c = self._prepare(sched.features, sched.mask, static, forcing=not static)
        if self.hard and self.training:
            mode = "soft" if float(torch.rand((), device="cpu")) < self.cfg.soft_fraction else "sample"
        else:
            mode = self._test_mode()
        words = self.embedding(sched.inputs)  # [B,T,E], all steps at once
        with forcing.no_autocast(words.device):
            x_steps = step.word_gates(words.transpose(0, 1)).unbind(0)  # T x [B,4H]
            steps = forcing.unroll(step, x_steps, memory, h, c, mode, sched.active)
        return forcing.losses(self, words, steps, sched, memory["mask"], label_smoothing)
