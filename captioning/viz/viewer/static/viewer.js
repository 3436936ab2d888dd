// The attention viewer: plain ES2020, no dependencies, opened from disk.
// data/index.js calls Viewer.index({...}) (every item's id, captions, metrics, pointing counts);
// data/page-NNNN.js calls Viewer.page(n, [...]) (the items' words, attention rows as base64
// float16, images) and is loaded by a <script> element when one of its items is shown.
"use strict";

const Viewer = (() => {
  const S = {index: null, pages: new Map(), waiting: new Map(), order: [], pos: -1, item: null,
             word: null, pinned: null, frame: 0, compare: false, ready: false};
  const $ = (id) => document.getElementById(id);
  const MAX_ROWS = 400;  // list rows drawn at once (the filter narrows the rest)

  // ------------------------------------------------------------------ data
  function page(n, items) {
    S.pages.set(n, items);
    (S.waiting.get(n) || []).forEach((f) => f(items));
    S.waiting.delete(n);
  }

  function loadPage(n) {
    if (S.pages.has(n)) return Promise.resolve(S.pages.get(n));
    return new Promise((resolve, reject) => {
      if (!S.waiting.has(n)) {
        S.waiting.set(n, []);
        const s = document.createElement("script");
        s.src = `data/page-${String(n).padStart(4, "0")}.js`;
        s.onerror = () => reject(new Error(`cannot load ${s.src}`));
        document.head.appendChild(s);
      }
      S.waiting.get(n).push(resolve);
    });
  }

  function half(h) {  // IEEE 754 binary16 -> number
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
    if (e === 0) return s * f * 2 ** -24;
    if (e === 31) return f ? NaN : s * Infinity;
    return s * (1 + f / 1024) * 2 ** (e - 15);
  }

  function rows(run) {  // [T][N] Float32Arrays, decoded once per run
    if (!run || !run.att) return null;
    if (!run._rows) {
      const bytes = Uint8Array.from(atob(run.att), (c) => c.charCodeAt(0));
      const view = new DataView(bytes.buffer), n = run.n, out = [];
      for (let t = 0; t < run.tok.length; t++) {
        const row = new Float32Array(n);
        for (let i = 0; i < n; i++) row[i] = half(view.getUint16(2 * (t * n + i), true));
        out.push(row);
      }
      run._rows = out;
    }
    return run._rows;
  }

  const argmax = (a) => a.reduce((best, v, i) => (v > a[best] ? i : best), 0);

  function perFrame(row, layout) {  // [K*cells] -> [K] (the cells of each frame summed)
    const c = layout.cells || 1, k = row.length / c, out = new Float32Array(k);
    for (let i = 0; i < row.length; i++) out[Math.floor(i / c)] += row[i];
    return out;
  }

  // ------------------------------------------------------------------ list, filter, sort
  function sortKeys() {
    const opts = [["", "dataset order"]];
    for (const m of S.index.metrics) opts.push([`${m}:1`, `${m}: low first`], [`${m}:-1`, `${m}: high first`]);
    if (S.index.runs.length > 1) for (const m of S.index.metrics) opts.push([`${m}:d`, `${m}: B - A, high first`]);
    $("sort").innerHTML = opts.map(([v, l]) => `<option value="${v}">${esc(l)}</option>`).join("");
  }

  function metricOf(e, key) {
    const [m, how] = key.split(":"), a = e.m[0] ? e.m[0][m] : null;
    if (how !== "d") return a;
    const b = e.m[1] ? e.m[1][m] : null;
    return a == null || b == null ? null : b - a;
  }

  function filtered() {
    const q = $("search").value.trim().toLowerCase(), pt = $("pointing").value, sort = $("sort").value;
    const most = parseFloat($("metric-max").value);
    let out = [];
    S.index.items.forEach((e, i) => {
      if (q && !(String(e.k).toLowerCase().includes(q) || e.c.some((c) => c && c.toLowerCase().includes(q)))) return;
      const g = e.g[0];
      if (pt === "miss" && !(g && g[1] > 0)) return;
      if (pt === "hit" && !(g && g[1] === 0)) return;
      if (pt === "none" && g) return;
      if (sort && !Number.isNaN(most)) { const v = metricOf(e, sort); if (v == null || v > most) return; }
      out.push(i);
    });
    if (sort) {
      const sign = sort.endsWith(":1") ? 1 : -1, v = (i) => metricOf(S.index.items[i], sort);
      out = out.sort((a, b) => (v(a) ?? Infinity * sign) * sign - (v(b) ?? Infinity * sign) * sign || a - b);
    }
    return out;
  }

  function renderList() {
    const current = S.order[S.pos];
    S.order = filtered();
    S.pos = Math.max(0, S.order.indexOf(current));
    const m = ($("sort").value || "").split(":")[0] || S.index.metrics[0];
    $("list").innerHTML = S.order.slice(0, MAX_ROWS).map((i, p) => {
      const e = S.index.items[i], g = e.g[0], v = m && e.m[0] ? e.m[0][m] : null;
      return `<div class="row" data-pos="${p}"><span class="id" title="${esc(e.k)}">${esc(String(e.k).split("/").pop())}</span>` +
        `<span class="cap">${esc(e.c[0] || "")}</span>` +
        (v == null ? "" : `<span class="metric" title="${esc(m)}">${v.toFixed(2)}</span>`) +
        (g ? `<span class="pt">${g[0]}&#10003; ${g[1]}&#10007;</span>` : "") + "</div>";
    }).join("") + (S.order.length > MAX_ROWS ? `<p class="more">${S.order.length - MAX_ROWS} more: narrow the search</p>` : "");
    $("count").textContent = `${S.order.length} of ${S.index.count} items`;
    markRow();
  }

  function markRow() {
    document.querySelectorAll("#list .row.on").forEach((r) => r.classList.remove("on"));
    const row = document.querySelector(`#list .row[data-pos="${S.pos}"]`);
    if (row) { row.classList.add("on"); row.scrollIntoView({block: "nearest"}); }
  }

  async function select(pos) {
    if (!S.order.length) { $("panels").innerHTML = "<p>No item matches.</p>"; return; }
    S.pos = Math.min(Math.max(pos, 0), S.order.length - 1);
    const i = S.order[S.pos], n = Math.floor(i / S.index.page_size);
    markRow();
    let items;
    try { items = await loadPage(n); } catch (err) { $("panels").textContent = String(err); return; }
    if (S.order[S.pos] !== i) return;  // another item was selected meanwhile
    S.item = items[i % S.index.page_size];
    S.word = S.pinned = null;
    S.frame = 0;
    history.replaceState(null, "", `#${encodeURIComponent(S.item.k)}`);
    renderItem();
    if (!S.ready) { S.ready = true; document.body.dataset.ready = "1"; window.viewerReadyMs = performance.now(); }
  }

  // ------------------------------------------------------------------ one item
  function shownRuns() {
    return S.index.runs.map((_, r) => r).filter((r) => r === 0 || S.compare);
  }

  function renderItem() {
    const it = S.item;
    $("panels").innerHTML = shownRuns().map((r) => panelHtml(it, r)).join("");
    for (const r of shownRuns()) {
      const panel = $(`panel-${r}`);
      panel.querySelectorAll(".w").forEach((w) => {
        const word = {r, t: +w.dataset.t};
        w.addEventListener("mouseenter", () => show(word));
        w.addEventListener("mouseleave", () => show(S.pinned));
        w.addEventListener("click", () => { S.pinned = word; show(word); });
      });
      panel.querySelectorAll(".thumb").forEach((th) => {
        th.addEventListener("mouseenter", () => setFrame(+th.dataset.k));
      });
    }
    show(null);
  }

  function panelHtml(it, r) {
    const info = S.index.runs[r], run = it.r[r], lay = info.layout;
    const head = `<h2>${esc(info.name)}</h2><p class="src">${esc(info.source)}` +
      (info.streams ? ` &middot; streams ${info.streams.map(esc).join(" + ")} (one weight per position, shared)` : "") +
      (info.hard ? " &middot; hard (argmax) attention" : "") + (info.note ? ` &middot; ${esc(info.note)}` : "") + "</p>";
    if (!run) return `<div class="panel" id="panel-${r}">${head}<p class="none">no caption of ${esc(it.k)} in this run</p></div>`;
    const lp = run.lp || [], g = new Map(run.g.map((x) => [x.t, x]));
    const words = run.tok.map((w, t) => {
      const p = lp[t] == null ? null : Math.exp(lp[t]), gr = g.get(t);
      const title = [p == null ? "" : `log p = ${lp[t].toFixed(3)} (p = ${p.toFixed(2)})`,
        gr ? (gr.hit ? "attention points into the object it names" : "attention points outside the object it names") : ""]
        .filter(Boolean).join("; ");
      return `<span class="w" data-t="${t}" title="${esc(title)}">${esc(w)}` +
        (gr ? `<sup class="${gr.hit ? "hit" : "miss"}">${gr.hit ? "&#10003;" : "&#10007;"}</sup>` : "") +
        (p == null ? "" : `<i class="lp" style="width:${(100 * p).toFixed(0)}%"></i>`) + "</span>";
    }).join(" ");
    const metrics = Object.entries(run.m).map(([k, v]) => `${esc(k)} ${v == null ? "-" : v.toFixed(3)}`);
    if (run.sc != null) metrics.push(`score ${run.sc.toFixed(3)}`);
    const nbest = run.nb.length ? `<ol class="nbest">${run.nb.map(([c, s]) =>
      `<li><span class="score">${s == null ? "" : s.toFixed(3)}</span> ${esc(c)}</li>`).join("")}</ol>` : "";
    return `<div class="panel" id="panel-${r}" data-layout="${lay.type}">${head}${stageHtml(it, lay)}` +
      `<p class="caption">${words}</p><p class="info" id="info-${r}"></p>` +
      `<p class="metrics">${metrics.join(" &middot; ")}</p>${nbest}${refsHtml(it, r)}</div>`;
  }

  function refsHtml(it, r) {
    if (r !== 0 || !it.refs.length) return "";
    return `<details><summary>references (${it.refs.length})</summary><ul>${it.refs.map((c) => `<li>${esc(c)}</li>`).join("")}</ul></details>`;
  }

  function stageHtml(it, lay) {
    const [w, h] = it.wh || [1, 1], ratio = (100 * h / w).toFixed(3);
    const note = it.note ? `<p class="note">${esc(it.note)}</p>` : "";
    if (S.index.kind !== "video") {
      const img = it.img ? `<img src="${it.img}" alt="${esc(it.k)}">` : "";
      return `<div class="stage" style="padding-top:${ratio}%">${img}<canvas class="overlay"></canvas>` +
        `<div class="marker" hidden></div><div class="object" hidden></div></div>${note}`;
    }
    const k = (it.fi || []).length || lay.frames || 1;
    const sprite = it.img ? `background-image:url('${it.img}');background-size:${100 * k}% 100%;` : "";
    const bars = Array.from({length: k}, (_, i) => `<div class="thumb" data-k="${i}"><i class="bar"></i></div>`).join("");
    const thumbs = Array.from({length: k}, (_, i) =>
      `<div class="thumb" data-k="${i}" style="${sprite}background-position:${k > 1 ? (100 * i / (k - 1)).toFixed(4) : 0}% 0">` +
      `<span>${it.fi ? it.fi[i] : i}</span></div>`).join("");
    return `<div class="stage frame" style="padding-top:${ratio}%;${sprite}"><canvas class="overlay"></canvas>` +
      `<div class="marker" hidden></div></div><p class="frame-label"></p>` +
      `<div class="strip bars">${bars}</div><div class="strip frames">${thumbs}</div>${note}`;
  }

  // ------------------------------------------------------------------ showing a word
  function wordIn(run, word, from) {  // the t of `word` in `run` (the same occurrence as in `from`)
    if (!run || !word) return -1;
    const w = from.tok[word.t], occ = from.tok.slice(0, word.t).filter((x) => x === w).length;
    const at = run.tok.map((x, t) => (x === w ? t : -1)).filter((t) => t >= 0);
    return at.length ? at[Math.min(occ, at.length - 1)] : -1;
  }

  function show(word) {
    const other = word && (!S.word || word.r !== S.word.r || word.t !== S.word.t);
    S.word = word;
    const it = S.item;
    if (other) {  // another word with temporal attention: the large frame moves to its most attended frame
      const lay = S.index.runs[word.r].layout, rs = rows(it.r[word.r]);
      if (lay.type === "frames" && rs) setFrame(argmax(Array.from(perFrame(rs[word.t], lay))), false);
    }
    for (const r of shownRuns()) {
      const run = it.r[r], t = !word ? -1 : word.r === r ? word.t : wordIn(run, word, it.r[word.r]);
      drawPanel(r, run, t, word ? it.r[word.r].tok[word.t] : null);
    }
  }

  function setFrame(k, redraw = true) {
    S.frame = k;
    if (redraw) show(S.word);
  }

  function drawPanel(r, run, t, text) {
    const panel = $(`panel-${r}`);
    if (!panel || !run) return;
    const lay = S.index.runs[r].layout, rs = rows(run), row = rs && t >= 0 ? rs[t] : null;
    panel.querySelectorAll(".w").forEach((w) => w.classList.toggle("on", +w.dataset.t === t));
    panel.dataset.t = t;
    panel.dataset.word = t >= 0 ? run.tok[t] : "";
    const canvas = panel.querySelector("canvas.overlay"), marker = panel.querySelector(".marker");
    const g = run.g.find((x) => x.t === t);
    drawObject(panel, g);
    let where = "";
    if (lay.type === "frames") where = drawFrames(panel, row, lay, rs, g);
    else if (!row) { clear(canvas); marker.hidden = true; panel.dataset.argmax = ""; }
    else if (lay.type === "grid") where = drawGrid(canvas, marker, row, lay.grid, panel);
    else if (lay.type === "regions") where = drawRegions(canvas, marker, row, S.item.bx, panel);
    else { clear(canvas); where = `most attended position ${argmax(Array.from(row))}`; }
    const info = $(`info-${r}`);
    if (t < 0) { info.textContent = text ? `"${text}" is not in this caption` : "hover a word"; return; }
    const lp = run.lp && run.lp[t] != null ? ` · log p ${run.lp[t].toFixed(3)}` : "";
    const gr = g ? ` · names an object: ${g.hit ? "points into it" : "points outside it"}, ${(100 * g.mass).toFixed(0)}% of the attention inside` : "";
    info.textContent = `"${run.tok[t]}" (word ${t + 1} of ${run.tok.length})${lp} · ${where}${gr}`;
  }

  function clear(canvas) {
    if (canvas) canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  }

  function colour(v) {  // heat v in [0, 1] -> [r, g, b], a blue-cyan-yellow-red ramp ("jet")
    const f = (x) => Math.round(255 * Math.min(1, Math.max(0, 1.5 - Math.abs(4 * v - x))));
    return [f(3), f(2), f(1)];
  }

  function paint(data, i, v) {  // one overlay pixel for heat v: coloured (heat) or dimming the rest (spotlight)
    if ($("style").value === "spotlight") { data[i] = data[i + 1] = data[i + 2] = 0; data[i + 3] = Math.round(230 * (1 - v)); return; }
    const [r, g, b] = colour(v);
    data[i] = r; data[i + 1] = g; data[i + 2] = b; data[i + 3] = Math.round(255 * (0.2 + 0.8 * v));
  }

  function drawGrid(canvas, marker, row, grid, panel) {
    // Bilinear upsampling of the [h, w] cells (cell centres at (c + 0.5) * cell px); an odd cell
    // size puts a pixel's centre exactly on every cell centre, where the heat is the cell's own.
    const [h, w] = grid, max = Math.max(...row) || 1;
    let cell = Math.ceil(240 / Math.max(h, w));
    if (cell % 2 === 0) cell += 1;
    canvas.width = w * cell; canvas.height = h * cell;
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(canvas.width, canvas.height);
    for (let y = 0; y < canvas.height; y++) {
      const gy = Math.min(Math.max((y + 0.5) / cell - 0.5, 0), h - 1), y0 = Math.floor(gy), y1 = Math.min(y0 + 1, h - 1), fy = gy - y0;
      for (let x = 0; x < canvas.width; x++) {
        const gx = Math.min(Math.max((x + 0.5) / cell - 0.5, 0), w - 1), x0 = Math.floor(gx), x1 = Math.min(x0 + 1, w - 1), fx = gx - x0;
        const v = (1 - fy) * ((1 - fx) * row[y0 * w + x0] + fx * row[y0 * w + x1]) + fy * ((1 - fx) * row[y1 * w + x0] + fx * row[y1 * w + x1]);
        paint(img.data, 4 * (y * canvas.width + x), v / max);
      }
    }
    ctx.putImageData(img, 0, 0);
    const a = argmax(Array.from(row)), rr = Math.floor(a / w), cc = a % w;
    place(marker, [cc / w, rr / h, (cc + 1) / w, (rr + 1) / h]);
    panel.dataset.argmax = `${rr},${cc}`;
    return `most attended cell: row ${rr + 1}, column ${cc + 1} of ${h}x${w} (${(100 * row[a]).toFixed(1)}%)`;
  }

  function drawRegions(canvas, marker, row, boxes, panel) {
    const a = argmax(Array.from(row));
    panel.dataset.argmax = String(a);
    if (!boxes) { clear(canvas); marker.hidden = true; return `most attended region ${a + 1} of ${row.length} (no boxes)`; }
    const stage = canvas.parentElement, W = canvas.width = stage.clientWidth || 320, H = canvas.height = stage.clientHeight || 320;
    const ctx = canvas.getContext("2d"), max = Math.max(...row) || 1;
    ctx.fillStyle = $("style").value === "spotlight" ? "rgba(0,0,0,0.8)" : "rgba(0,0,0,0)";
    ctx.fillRect(0, 0, W, H);
    const order = Array.from(row, (_, i) => i).filter((i) => i < boxes.length).sort((i, j) => row[i] - row[j]);
    for (const i of order) {
      const [x0, y0, x1, y1] = boxes[i], v = row[i] / max, [r, g, b] = colour(v);
      if ($("style").value === "spotlight") ctx.clearRect(x0 * W, y0 * H, (x1 - x0) * W, (y1 - y0) * H);
      ctx.fillStyle = `rgba(${r},${g},${b},${($("style").value === "spotlight" ? 0 : 0.55 * v).toFixed(3)})`;
      ctx.fillRect(x0 * W, y0 * H, (x1 - x0) * W, (y1 - y0) * H);
      ctx.strokeStyle = `rgba(255,255,255,${(0.25 + 0.75 * v).toFixed(3)})`;
      ctx.strokeRect(x0 * W, y0 * H, (x1 - x0) * W, (y1 - y0) * H);
    }
    if (a < boxes.length) place(marker, boxes[a]);
    return `most attended region ${a + 1} of ${row.length} (${(100 * row[a]).toFixed(1)}%)`;
  }

  function drawFrames(panel, row, lay, rs, g) {
    const k = panel.querySelectorAll(".frames .thumb").length, canvas = panel.querySelector("canvas.overlay");
    const marker = panel.querySelector(".marker");
    const weights = row ? perFrame(row, lay) : meanFrames(rs, lay, k), top = argmax(Array.from(weights));
    const max = Math.max(...weights) || 1, inEvent = new Set(g && g.frames ? g.frames : []);
    panel.querySelectorAll(".bars .bar").forEach((bar, i) => {
      bar.style.height = `${(100 * (weights[i] || 0) / max).toFixed(1)}%`;
      bar.classList.toggle("top", i === top && !!row);
    });
    panel.querySelectorAll(".frames .thumb").forEach((th, i) => {
      th.classList.toggle("now", i === S.frame);
      th.classList.toggle("event", inEvent.has(i));
    });
    const stage = panel.querySelector(".stage");
    stage.style.backgroundPosition = `${k > 1 ? (100 * S.frame / (k - 1)).toFixed(4) : 0}% 0`;
    panel.dataset.frame = S.frame;
    panel.dataset.argmax = row ? String(top) : "";
    const fi = S.item.fi ? S.item.fi[S.frame] : S.frame;
    panel.querySelector(".frame-label").textContent = `frame ${fi} (${S.frame + 1} of ${k})` +
      (row ? `, ${(100 * (weights[S.frame] || 0)).toFixed(1)}% of the word's attention` : "");
    marker.hidden = true;
    if (row && lay.cells > 1 && lay.grid) {  // 3-D / grid video features: the frame's own cells
      const cells = row.slice(S.frame * lay.cells, (S.frame + 1) * lay.cells);
      drawGrid(canvas, marker, cells, lay.grid, {dataset: {}});
    } else clear(canvas);
    return row ? `most attended frame ${S.item.fi ? S.item.fi[top] : top} (${top + 1} of ${k}, ${(100 * weights[top]).toFixed(1)}%)` : "";
  }

  function meanFrames(rs, lay, k) {  // no word shown: the caption's mean attention per frame
    const out = new Float32Array(k);
    if (!rs || !rs.length) return out;
    for (const row of rs) perFrame(row, lay).forEach((v, i) => { out[i] += v / rs.length; });
    return out;
  }

  function drawObject(panel, g) {
    const box = panel.querySelector(".object");
    if (!box) return;
    if (!g || !g.box) { box.hidden = true; return; }
    place(box, g.box);
    box.classList.toggle("hit", !!g.hit);
    box.classList.toggle("miss", !g.hit);
  }

  function place(el, [x0, y0, x1, y1]) {  // an element over the fractions x0..x1, y0..y1 of the stage
    Object.assign(el.style, {left: `${100 * x0}%`, top: `${100 * y0}%`, width: `${100 * (x1 - x0)}%`, height: `${100 * (y1 - y0)}%`});
    el.hidden = false;
  }

  // ------------------------------------------------------------------ controls
  function step(dt) {
    const r = S.pinned ? S.pinned.r : 0, run = S.item && S.item.r[r];
    if (!run) return;
    const t = S.pinned ? S.pinned.t + dt : dt > 0 ? 0 : run.tok.length - 1;
    S.pinned = {r, t: Math.min(Math.max(t, 0), run.tok.length - 1)};
    show(S.pinned);
  }

  function keys(ev) {
    if (["INPUT", "SELECT"].includes(ev.target.tagName) && ev.key !== "Escape") return;  // typing in a control
    const k = S.item && S.item.fi ? S.item.fi.length : 0;
    const act = {j: () => select(S.pos + 1), ArrowDown: () => select(S.pos + 1), k: () => select(S.pos - 1),
      ArrowUp: () => select(S.pos - 1), l: () => step(1), ArrowRight: () => step(1), h: () => step(-1),
      ArrowLeft: () => step(-1), "]": () => k && setFrame(Math.min(S.frame + 1, k - 1)),
      "[": () => k && setFrame(Math.max(S.frame - 1, 0)), c: () => toggleCompare(),
      "/": () => $("search").focus(), Escape: () => { ev.target.blur(); S.pinned = null; show(null); }}[ev.key];
    if (act) { ev.preventDefault(); act(); }
  }

  function toggleCompare(on = !S.compare) {
    if (S.index.runs.length < 2) return;
    S.compare = on;
    document.body.classList.toggle("comparing", on);
    $("compare").textContent = on ? "single" : "compare";
    if (S.item) renderItem();
  }

  function init() {
    const ix = S.index;
    $("title").textContent = ix.title;
    document.title = ix.title;
    sortKeys();
    const refilter = () => { renderList(); select(0); };
    ["search", "pointing", "sort", "metric-max"].forEach((id) => $(id).addEventListener("input", refilter));
    $("opacity").addEventListener("input", () => document.body.style.setProperty("--overlay", $("opacity").value));
    $("style").addEventListener("input", () => show(S.word));
    $("list").addEventListener("click", (ev) => { const row = ev.target.closest(".row"); if (row) select(+row.dataset.pos); });
    $("compare").hidden = ix.runs.length < 2;
    $("compare").addEventListener("click", () => toggleCompare());
    document.addEventListener("keydown", keys);
    toggleCompare(ix.runs.length > 1);
    renderList();
    const key = decodeURIComponent(location.hash.slice(1)), at = ix.items.findIndex((e) => String(e.k) === key);
    select(at >= 0 ? Math.max(0, S.order.indexOf(at)) : 0);
  }

  function index(data) { S.index = data; init(); }

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }

  return {index, page, rows, state: S, show, select, setFrame, toggleCompare};
})();
