// shoal's live dashboard: polls data.json once a second and draws, with uPlot, one card
// for the server, one per loaded model version and one per extra section. A model version
// that is no longer in data.json (unloaded) loses its card at the next update.
// window.shoalDashboard exposes the state, for the end-to-end test and for debugging.
'use strict';
(function () {
  const POLL_MS = 1000;
  const HISTORY = 300; // points kept per chart: five minutes at one a second
  const BATCH_WINDOWS = 30; // the batch-size distribution sums the last 30 samples
  const PLOT_HEIGHT = 150;
  const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2',
    '#17becf', '#7f7f7f', '#bcbd22'];
  const REASONS = ['queue_full', 'overload', 'invalid', 'timeout', 'deadline', 'cancelled'];

  const state = {
    seq: null, // the last sample drawn
    updates: 0, // samples drawn since the page loaded
    errors: 0,
    charts: new Map(), // "<card key>/<chart>" -> Chart
    cards: new Map(), // card key -> Card
    last: null, // the last data.json
  };
  window.shoalDashboard = state;

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c);
    return e;
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || !Number.isFinite(v)) return '–';
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    return v.toFixed(digits === undefined ? (a >= 100 ? 0 : a >= 10 ? 1 : 2) : digits);
  }
  // Axis ticks: as few digits as the tick needs ("0", "0.5", "20", "1.5k").
  function fmtTick(v) {
    if (v === null || !Number.isFinite(v)) return '';
    const a = Math.abs(v);
    if (a >= 1e6) return +(v / 1e6).toFixed(2) + 'M';
    if (a >= 1e4) return +(v / 1e3).toFixed(2) + 'k';
    return String(+v.toFixed(3));
  }
  function fmtBytes(v) {
    if (!Number.isFinite(v)) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return v.toFixed(v >= 100 || i === 0 ? 0 : 1) + ' ' + units[i];
  }

  // One chart in a card: a title, the latest value in words, and a uPlot. Time charts keep
  // the last HISTORY points; a series that appears later (an instance, a tier, a section's
  // value) rebuilds the plot with the history it has, earlier points null.
  class Chart {
    // spec: {title, unit, series: [{name, label, dash, color}], yMin, yMax, format, note,
    //        kind: 'time' | 'bars' | 'steps', yLabels (steps: value -> label)}
    constructor(key, parent, spec) {
      this.key = key;
      this.spec = spec;
      this.xs = [];
      this.ys = new Map(); // series name -> values
      this.names = [];
      this.value = el('span', { class: 'chart-value', 'data-value': '' });
      this.plot = el('div', { class: 'plot' });
      this.root = el('div', { class: 'chart', 'data-chart': key.split('/').pop() },
        el('div', { class: 'chart-head' }, el('span', { class: 'chart-title', text: spec.title }),
          this.value),
        this.plot);
      parent.append(this.root);
      this.u = null;
      this.noteShown = false;
      this.observer = new ResizeObserver(() => this.resize());
      this.observer.observe(this.plot);
      state.charts.set(key, this);
    }

    width() { return Math.max(120, Math.floor(this.plot.clientWidth)); }

    resize() {
      if (this.u && Math.abs(this.u.width - this.width()) >= 1) {
        // A bar chart picks which labels to show by its width: draw it again.
        if (this.spec.kind === 'bars') this.build();
        else this.u.setSize({ width: this.width(), height: PLOT_HEIGHT });
      }
    }

    // Instead of a plot (e.g. "no response cache for this model").
    showNote(text) {
      if (this.u) { this.u.destroy(); this.u = null; }
      this.plot.replaceChildren(el('p', { class: 'note', text }));
      this.noteShown = true;
    }

    seriesSpec(name) {
      return (this.spec.series || []).find((s) => s.name === name) || { name, label: name };
    }

    build() {
      if (this.u) this.u.destroy();
      if (this.noteShown) { this.plot.replaceChildren(); this.noteShown = false; }
      const spec = this.spec;
      const series = [{}];
      this.names.forEach((name, i) => {
        const s = this.seriesSpec(name);
        const opts = {
          label: s.label || name,
          stroke: s.color || COLORS[i % COLORS.length],
          width: 1.5,
          points: { show: false },
          value: (u, v) => (spec.format || fmt)(v),
        };
        if (s.dash) opts.dash = [6, 4];
        if (spec.kind === 'bars') {
          opts.fill = (s.color || COLORS[i % COLORS.length]) + '99';
          opts.paths = uPlot.paths.bars({ size: [0.7, 60] });
        } else if (spec.kind === 'steps') {
          opts.paths = uPlot.paths.stepped({ align: 1 });
        }
        series.push(opts);
      });
      const yRange = (u, min, max) => {
        let lo = spec.yMin !== undefined ? spec.yMin : Math.min(0, min);
        let hi = spec.yMax !== undefined ? Math.max(spec.yMax, max || 0) : max;
        if (!Number.isFinite(hi) || hi <= lo) hi = lo + 1;
        return [lo, spec.kind === 'steps' ? hi + 0.5 : hi * 1.08];
      };
      const yAxis = {
        size: 46,
        values: (u, vals) => vals.map((v) => (spec.yLabels ? (spec.yLabels[v] || '') : fmtTick(v))),
      };
      if (spec.kind === 'steps') yAxis.splits = () => Object.keys(spec.yLabels || {}).map(Number);
      let xAxis = { space: 60 };
      let xScale = { time: true };
      if (spec.kind === 'bars') {
        const n = this.xs.length;
        xScale = { time: false, range: () => [-0.5, n - 0.5] };
        // Every bucket's label when they fit (about 40 px each), else every other one.
        const step = this.width() / Math.max(1, n) < 40 ? 2 : 1;
        xAxis = {
          splits: () => this.xs,
          values: (u, vals) => vals.map((i) => (i % step ? '' : (spec.xLabels || [])[i] || '')),
          space: 24,
        };
      }
      this.u = new uPlot({
        width: this.width(),
        height: PLOT_HEIGHT,
        series,
        scales: { x: xScale, y: { range: yRange } },
        axes: [xAxis, yAxis],
        legend: { live: false },
        cursor: { drag: { x: false, y: false } },
      }, this.data(), this.plot);
    }

    data() { return [this.xs, ...this.names.map((n) => this.ys.get(n))]; }

    // Appends one point: values is {series name: number or null}.
    push(t, values) {
      let rebuild = !this.u;
      for (const name of Object.keys(values)) {
        if (!this.ys.has(name)) {
          this.ys.set(name, this.xs.map(() => null));
          this.names.push(name);
          rebuild = true;
        }
      }
      this.xs.push(t);
      for (const name of this.names) {
        const v = values[name];
        this.ys.get(name).push(v === undefined || v === null ? null : v);
      }
      if (this.xs.length > HISTORY) {
        this.xs.shift();
        for (const ys of this.ys.values()) ys.shift();
      }
      if (rebuild) this.build();
      else this.u.setData(this.data());
    }

    // Replaces everything (bar charts): xs are indices, values {series: [numbers]}.
    replace(xs, values) {
      const same = this.u && xs.length === this.xs.length &&
        Object.keys(values).every((n) => this.ys.has(n));
      this.xs = xs;
      for (const [name, ys] of Object.entries(values)) {
        if (!this.ys.has(name)) this.names.push(name);
        this.ys.set(name, ys);
      }
      if (same) this.u.setData(this.data());
      else this.build();
    }

    setValue(text) { this.value.textContent = text; }

    destroy() {
      this.observer.disconnect();
      if (this.u) this.u.destroy();
      this.root.remove();
      state.charts.delete(this.key);
    }
  }

  // A card: a titled box with a grid of charts.
  class Card {
    constructor(key, parent, title, attrs) {
      this.key = key;
      this.charts = new Map();
      this.heading = el('h2', {}, el('span', { class: 'card-title', text: title }));
      this.grid = el('div', { class: 'charts' });
      this.root = el('section', Object.assign({ class: 'card' }, attrs || {}), this.heading,
        this.grid);
      parent.append(this.root);
      state.cards.set(key, this);
    }
    badge(name, text) {
      let b = this.heading.querySelector(`[data-badge="${name}"]`);
      if (!text) { if (b) b.remove(); return; }
      if (!b) { b = el('span', { class: 'badge', 'data-badge': name }); this.heading.append(b); }
      b.textContent = text;
    }
    chart(name, spec) {
      if (!this.charts.has(name)) {
        this.charts.set(name, new Chart(`${this.key}/${name}`, this.grid, spec));
      }
      return this.charts.get(name);
    }
    destroy() {
      for (const c of this.charts.values()) c.destroy();
      this.root.remove();
      state.cards.delete(this.key);
    }
  }

  let serverCard = null;
  function updateServer(d, t) {
    if (!serverCard) {
      const root = document.getElementById('server');
      serverCard = { grid: root.querySelector('.charts') };
      serverCard.cpu = new Chart('server/cpu', serverCard.grid, {
        title: 'CPU (% of one core)', series: [{ name: 'cpu', label: 'CPU %' }], yMin: 0,
      });
      serverCard.rss = new Chart('server/rss', serverCard.grid, {
        title: 'Resident memory (MiB)', series: [{ name: 'rss', label: 'RSS' }], yMin: 0,
        format: (v) => fmt(v) + ' MiB',
      });
    }
    const s = d.server;
    serverCard.cpu.push(t, { cpu: s.cpu_percent });
    serverCard.cpu.setValue(`${fmt(s.cpu_percent, 0)}% · ${s.cpus} CPUs`);
    serverCard.rss.push(t, { rss: s.rss_bytes === null ? null : s.rss_bytes / 1048576 });
    serverCard.rss.setValue(fmtBytes(s.rss_bytes));
    const c = d.response_cache;
    const cacheText = c ? `response cache ${fmtBytes(c.bytes)} of ${fmtBytes(c.capacity_bytes)}` +
      (c.hit_ratio === null ? '' : `, ${fmt(c.hit_ratio * 100, 0)}% hits`) : '';
    const h = document.querySelector('#server h2');
    h.replaceChildren('Server', ...[s.ready ? 'ready' : 'not ready', cacheText].filter(Boolean)
      .map((text) => el('span', { class: 'badge', text })));
  }

  function batchLabels(bounds) {
    const labels = bounds.map((b, i) => {
      const lo = i === 0 ? 1 : bounds[i - 1] + 1;
      return lo === b ? String(b) : `${lo}–${b}`;
    });
    labels.push(`>${bounds[bounds.length - 1]}`);
    return labels;
  }

  function updateModel(m, t) {
    const key = `${m.model}/${m.version}`;
    let card = state.cards.get(key);
    if (!card) {
      card = new Card(key, document.getElementById('models'), m.model,
        { 'data-model': m.model, 'data-version': String(m.version), class: 'card model' });
      card.badge('version', `version ${m.version}`);
      card.batchHistory = [];
    }
    card.badge('slo', m.slo_ms === null ? '' : `SLO ${fmt(m.slo_ms)} ms`);
    card.badge('tier', m.precision.tier_name ? `precision ${m.precision.tier_name}` : '');

    const thr = card.chart('throughput', {
      title: 'Throughput (requests/s)', yMin: 0,
      series: [{ name: 'ok', label: 'answered' }, { name: 'failed', label: 'failed' }],
    });
    thr.push(t, { ok: m.requests_per_s, failed: m.failures_per_s });
    thr.setValue(`${fmt(m.requests_per_s)} req/s`);

    const lat = card.chart('latency', {
      title: 'Latency (ms)', yMin: 0,
      series: [{ name: 'p50', label: 'p50' }, { name: 'p95', label: 'p95' },
        { name: 'p99', label: 'p99' }, { name: 'slo', label: 'SLO', dash: true, color: '#c62828' }],
    });
    const l = m.latency_ms;
    const latValues = { p50: l.p50, p95: l.p95, p99: l.p99 };
    if (m.slo_ms !== null) latValues.slo = m.slo_ms;
    lat.push(t, latValues);
    lat.setValue(`p99 ${fmt(l.p99)} ms` + (m.slo_ms !== null ? ` / SLO ${fmt(m.slo_ms)}` : ''));

    const q = card.chart('queue', {
      title: 'Queue depth', yMin: 0,
      series: [{ name: 'queued', label: 'queued' }, { name: 'in_flight', label: 'in flight' }],
    });
    q.push(t, { queued: m.queue_depth, in_flight: m.in_flight });
    q.setValue(`${m.queue_depth} queued`);

    // Executions per batch-size bucket over the last BATCH_WINDOWS samples, as a share.
    const bs = m.batch_size;
    if (bs.counts) {
      card.batchHistory.push(bs.counts);
      if (card.batchHistory.length > BATCH_WINDOWS) card.batchHistory.shift();
    }
    let buckets = bs.bounds.length + 1;
    if (m.max_batch_size > 0) {
      const i = bs.bounds.findIndex((b) => b >= m.max_batch_size);
      if (i >= 0) buckets = i + 1;
    }
    const sums = new Array(buckets).fill(0);
    for (const counts of card.batchHistory) counts.forEach((c, i) => {
      if (i < buckets) sums[i] += c; else sums[buckets - 1] += c;
    });
    const total = sums.reduce((a, b) => a + b, 0);
    const batch = card.chart('batch_size', {
      title: 'Batch sizes (last 30 s)', kind: 'bars', yMin: 0, yMax: 100,
      xLabels: batchLabels(bs.bounds), series: [{ name: 'share', label: '% of executions' }],
    });
    batch.replace(sums.map((_, i) => i),
      { share: sums.map((c) => (total > 0 ? (100 * c) / total : 0)) });
    batch.setValue(`mean ${fmt(bs.mean)}`);

    const busy = card.chart('busy', {
      title: 'Instance busy (%)', yMin: 0, yMax: 100,
    });
    const busyValues = {};
    for (const inst of m.instances) busyValues[inst.name] = inst.busy_percent;
    busy.push(t, busyValues);
    const busyAvg = m.instances.length && m.instances.every((i) => i.busy_percent !== null)
      ? m.instances.reduce((a, i) => a + i.busy_percent, 0) / m.instances.length : null;
    busy.setValue(`${m.instances.length} instances, ${fmt(busyAvg, 0)}% avg`);

    const cache = card.chart('cache', { title: 'Cache hit rate (%)', yMin: 0, yMax: 100,
      series: [{ name: 'hits', label: 'hits %' }] });
    if (!m.cache_enabled) {
      if (!cache.noteShown) cache.showNote('No response cache for this model.');
      cache.setValue('off');
    } else {
      cache.push(t, { hits: m.cache_hit_ratio === null ? null : m.cache_hit_ratio * 100 });
      cache.setValue(m.cache_hit_ratio === null ? 'no lookups' : `${fmt(m.cache_hit_ratio * 100, 0)}%`);
    }

    const rej = card.chart('rejections', {
      title: 'Rejections (/s, by reason)', yMin: 0,
      series: REASONS.map((r) => ({ name: r, label: r.replace('_', ' ') })),
    });
    const rejValues = {};
    let rejTotal = 0;
    for (const r of REASONS) {
      rejValues[r] = m.rejections_per_s[r];
      rejTotal += m.rejections_per_s[r] || 0;
    }
    rej.push(t, rejValues);
    rej.setValue(`${fmt(rejTotal)}/s`);

    const p = m.precision;
    const labels = {};
    p.ladder.forEach((name, i) => { labels[i] = name; });
    const tier = card.chart('precision', {
      title: 'Precision tier', kind: 'steps', yMin: 0, yMax: Math.max(1, p.ladder.length - 1),
      yLabels: labels, series: [{ name: 'tier', label: 'tier' }],
    });
    if (p.ladder.length === 0) {
      if (!tier.noteShown) tier.showNote('No precision ladder configured.');
      const chosen = Object.keys(p.requests_per_s);
      tier.setValue(chosen.length ? `requests chose ${chosen.join(', ')}` : 'default');
    } else {
      tier.push(t, { tier: p.tier });
      tier.setValue(`${p.tier_name} (${p.switches_total} switches)`);
    }
  }

  function updateSection(s, t) {
    const key = `section:${s.name}`;
    let card = state.cards.get(key);
    if (!card) {
      card = new Card(key, document.getElementById('sections'), s.title || s.name,
        { 'data-section': s.name });
    }
    card.heading.querySelector('.card-title').textContent = s.title || s.name;
    s.charts.forEach((c, i) => {
      const chart = card.chart(`chart${i}`, { title: c.title });
      chart.push(t, c.series);
      chart.setValue(Object.entries(c.series).map(([k, v]) => `${k} ${fmt(v)}`).join(' · '));
    });
  }

  // Removes the cards whose key is not in `keep` among those whose key passes `mine`.
  function prune(mine, keep) {
    for (const [key, card] of [...state.cards]) {
      if (mine(key) && !keep.has(key)) card.destroy();
    }
  }

  function update(d) {
    const t = d.time_ms / 1000;
    updateServer(d, t);
    const models = new Set();
    for (const m of d.models) {
      models.add(`${m.model}/${m.version}`);
      updateModel(m, t);
    }
    prune((k) => !k.startsWith('section:'), models);
    document.getElementById('no-models').hidden = d.models.length > 0;
    const sections = new Set();
    for (const s of d.sections || []) {
      sections.add(`section:${s.name}`);
      updateSection(s, t);
    }
    prune((k) => k.startsWith('section:'), sections);
    state.last = d;
    state.updates++;
  }

  function setStatus(kind, text) {
    const s = document.getElementById('status');
    s.dataset.state = kind;
    s.textContent = text;
  }

  async function poll() {
    const started = performance.now();
    try {
      const r = await fetch('data.json', { cache: 'no-store' });
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      const d = await r.json();
      if (d.seq !== state.seq) {
        state.seq = d.seq;
        update(d);
      }
      setStatus('ok', 'live');
      document.getElementById('updated').textContent =
        'updated ' + new Date(d.time_ms).toLocaleTimeString();
    } catch (e) {
      state.errors++;
      setStatus('error', `no data: ${e.message}`);
    }
    setTimeout(poll, Math.max(0, POLL_MS - (performance.now() - started)));
  }

  poll();
})();
