// tpunb monitor: renders the `state` trait the kernel's sampler thread replaces each tick.
// Everything is rebuilt from state on each change: the state is small and ticks are 2-5 Hz.
// The same view fills a notebook's output and JupyterLab's side panel: it lays out for the
// width it gets (monitor.css folds the group table's detail columns in a narrow one), and
// every cell that may be cut short carries its whole text as a tooltip.

const NA = "n/a";

function bytes(n) {
  if (n === null || n === undefined) return NA;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n, unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

function ms(value) {
  return value === null || value === undefined ? NA : `${value.toFixed(1)} ms`;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function sparkline(points) {
  const width = 320, height = 48;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "tpunb-timeline");
  if (points.length < 2) return svg;
  const oldest = points[0][0];
  const span = Math.max(1e-6, -oldest);
  // Scaled to the samples, not the limit: movement matters more than headroom here.
  const low = Math.min(...points.map((p) => p[1]));
  const high = Math.max(...points.map((p) => p[1]));
  const range = Math.max(high - low, 1);
  const path = points
    .map(([t, used], i) => {
      const x = ((t - oldest) / span) * width;
      const y = height - ((used - low) / range) * (height - 4) - 2;
      return `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "path");
  line.setAttribute("d", path);
  svg.appendChild(line);
  return svg;
}

function memorySection(state) {
  const section = element("section", "tpunb-memory");
  const memory = state.memory;
  section.appendChild(element("h4", "", memory ? memory.label : "memory"));
  const text = memory
    ? `used ${bytes(memory.used)} · peak ${bytes(memory.peak)} · limit ${bytes(memory.limit)}`
    : NA;
  const readout = element("div", "tpunb-readout", text);
  readout.dataset.role = "memory-text";
  section.appendChild(readout);
  if (memory && memory.used !== null && memory.limit) {
    const bar = element("div", "tpunb-bar");
    const fill = element("div", "tpunb-bar-fill");
    fill.style.width = `${Math.min(100, (100 * memory.used) / memory.limit).toFixed(1)}%`;
    bar.appendChild(fill);
    if (memory.peak !== null) {
      const peak = element("div", "tpunb-bar-peak");
      peak.style.left = `${Math.min(100, (100 * memory.peak) / memory.limit).toFixed(1)}%`;
      bar.appendChild(peak);
    }
    section.appendChild(bar);
  }
  section.appendChild(sparkline(state.timeline || []));
  const cells = state.cells || [];
  if (cells.length) {
    const list = element("div", "tpunb-cells");
    for (const cell of cells.slice(0, 6)) {
      const peak = cell.peak_bytes === null ? "" : ` · peak ${bytes(cell.peak_bytes)}`;
      list.appendChild(element("div", "", `[${cell.cell ?? "?"}] ${cell.mode} · ${cell.wall_s.toFixed(2)} s${peak}`));
    }
    section.appendChild(list);
  }
  return section;
}

function cacheSection(state) {
  const section = element("section", "tpunb-cache");
  section.appendChild(element("h4", "", "compile cache"));
  const cache = state.cache || {};
  const details = state.compile || {};
  const rate = cache.requests ? `${Math.round((100 * cache.hits) / cache.requests)}%` : NA;
  const rows = [
    ["requests", cache.requests], ["hits", cache.hits], ["misses", cache.misses], ["hit rate", rate],
    ["compiles", cache.compiles], ["compile time", ms(details.compile_ms)], ["failed", details.failures ?? NA],
  ];
  const table = element("table", "tpunb-kv");
  for (const [name, value] of rows) {
    const row = table.insertRow();
    row.insertCell().textContent = name;
    row.insertCell().textContent = value === undefined || value === null ? NA : String(value);
  }
  section.appendChild(table);
  const last = state.last_compile;
  section.appendChild(element("div", "tpunb-note",
    last ? `last compile: ${last.key} ${last.ok ? "ok" : "failed"} in ${ms(last.compile_ms)}` : "last compile: n/a"));
  const recompile = element("div", "tpunb-note", `last recompile: ${state.last_recompile ?? NA}`);
  recompile.dataset.role = "last-recompile";
  section.appendChild(recompile);
  return section;
}

// [title, detail]: where the view is narrow (a side panel) the detail columns fold away and
// each group is two lines: status, runs, ops and run time, then its trigger
const GROUP_COLUMNS = [
  ["status", false], ["runs", false], ["ops", false], ["top ops", true], ["inputs", true],
  ["trigger", false], ["capture", true], ["compile", true], ["run", false],
];

// a row's status in the user's words (its GroupStatus stays the row's class, for the colour);
// why it ran so, and what it waits for, is the status cell's tooltip (the row's plan)
const STATUS_WORDS = {
  hit: "compiled", miss: "first seen", compiling: "compiling", "op by op": "as strict",
  compiled: "compiled", "compile failed": "compile failed",
};

function statusWords(group) {
  if (group.compiling_s != null) return `compiling ${group.compiling_s.toFixed(1)}s`;
  if (group.status === "miss" && group.compile_ms) return "compiled now";
  return STATUS_WORDS[group.status] ?? group.status;
}

function columnClass(title, detail) {
  const column = `tpunb-col-${title.replace(" ", "-")}`;
  return detail ? `${column} tpunb-detail` : column;
}

// "what flushed it at Cell In[3], line 4": where space runs out, the words are cut, never the
// place (the user's line is what the row points to)
function splitTrigger(cell, group) {
  const where = group.at ? ` at ${group.at}` : "";
  if (!where || !group.trigger.endsWith(where)) return;
  cell.replaceChildren(element("span", "tpunb-trigger-what", group.trigger.slice(0, -where.length)), where);
}

function groupsSection(state, model) {
  const section = element("section", "tpunb-groups");
  const heading = element("h4", "", `fusion groups · ${state.groups_total ?? 0}`);
  heading.dataset.role = "groups-count";
  section.appendChild(heading);
  const table = element("table", "tpunb-group-table");
  const head = table.createTHead().insertRow();
  for (const [title, detail] of GROUP_COLUMNS) {
    head.appendChild(element("th", columnClass(title, detail), title));
  }
  const body = table.createTBody();
  for (const group of state.groups || []) {
    const row = body.insertRow();
    row.className = `tpunb-status-${group.status.replaceAll(" ", "-")}`;
    row.title = `key ${group.key} · recorded at ${group.source}${group.plan ? ` · ${group.plan}` : ""}`;
    const topOps = Object.entries(group.top_ops).map(([name, n]) => `${name}×${n}`).join(" ");
    const shapes = group.input_shapes.map((s) => `[${s.join(",")}]`).join(" ");
    const timings = [ms(group.capture_ms), ms(group.compile_ms), ms(group.run_ms)];
    // one row per distinct group: how often it ran, and how long a background compile has taken
    const status = statusWords(group);
    const runs = `×${group.count ?? 1}`;
    // a call compiled whole is not recorded op by op: it has no op count to show
    const ops = group.whole_call ? "whole call" : group.ops;
    const values = [status, runs, ops, topOps, shapes, group.trigger, ...timings];
    values.forEach((value, i) => {
      const cell = row.insertCell();
      cell.textContent = String(value);
      cell.title = String(value);
      cell.className = columnClass(...GROUP_COLUMNS[i]);
    });
    const [statusCell, , opsCell, , , triggerCell] = row.cells;
    if (group.whole_call) opsCell.classList.add("tpunb-whole-call");
    splitTrigger(triggerCell, group);
    statusCell.title = group.plan ? `${status}: ${group.plan}` : status;
    row.addEventListener("click", () => model.send({ type: "graph", key: group.key }));
  }
  section.appendChild(table);
  const graph = model.get("graph");
  if (graph && graph.key) {
    section.appendChild(element("div", "tpunb-note", `graph of group ${graph.key}`));
    section.appendChild(element("pre", "tpunb-graph", graph.code));
  }
  return section;
}

function render({ model, el }) {
  const root = element("div", "tpunb-monitor");
  el.appendChild(root);
  const draw = () => {
    const state = model.get("state") || {};
    root.replaceChildren();
    const header = element("div", "tpunb-header");
    header.appendChild(element("span", "tpunb-title", "tpunb"));
    header.appendChild(element("span", "", `${state.runtime ?? NA} · ${state.device ?? NA}`));
    header.appendChild(element("span", `tpunb-mode tpunb-mode-${state.mode}`, state.mode ?? NA));
    const precision = element("span", "tpunb-precision", state.precision ?? "fp32");
    precision.dataset.role = "precision";
    header.appendChild(precision);
    root.appendChild(header);
    const panels = element("div", "tpunb-panels");
    panels.appendChild(memorySection(state));
    panels.appendChild(cacheSection(state));
    root.appendChild(panels);
    root.appendChild(groupsSection(state, model));
  };
  draw();
  model.on("change:state", draw);
  model.on("change:graph", draw);
  return () => {
    model.off("change:state", draw);
    model.off("change:graph", draw);
  };
}

export default { render };
