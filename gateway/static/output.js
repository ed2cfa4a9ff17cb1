/* Rich output: MIME bundles, HTML and SVG in sandboxed frames, and charts' data as tables. */

import { el } from "./page.js";
import { renderAnsi } from "./text.js";

// A module has no document.currentScript: the nonce is that of index.html's script element.
const NONCE = document.querySelector("script[nonce]")?.nonce || "";
const FRAME_MAX_HEIGHT = 1600;
const MIME_ORDER = [
  "text/html", "image/svg+xml", "image/png", "image/jpeg", "image/gif",
  "text/markdown", "text/latex", "application/json", "text/plain",
];

// -- charts as data ----------------------------------------------------------------------

const CHART_ROWS = 200;

function chartColumns(chart) {
  const x = chart.x_label || "x";
  const y = chart.y_label || "y";
  switch (chart.type) {
    case "line":
    case "scatter":
      return [["series", x, y], (e) => (e.points || []).map((p) => [e.label, p[0], p[1]])];
    case "bar":
      return [["label", "group", y], (e) => [[e.label, e.group, e.value]]];
    case "pie":
      return [["label", "angle", "share"],
        (e) => [[e.label, e.angle, `${((e.angle / 360) * 100).toFixed(1)}%`]]];
    case "box_and_whisker":
      return [["label", "min", "Q1", "median", "Q3", "max", "outliers"],
        (e) => [[e.label, e.min, e.first_quartile, e.median, e.third_quartile, e.max,
          (e.outliers || []).join(", ")]]];
    default:
      return null;
  }
}

function chartCell(value) {
  if (typeof value === "number") return String(Number(value.toPrecision(6)));
  return value === null || value === undefined ? "" : String(value);
}

// One chart's data as a table; a superchart as one table per part (null when nothing).
// Folded: the image says it first, and an open table of hundreds of rows would push the
// next cell out of sight. A superchart's parts open with it (one click shows them all).
export function chartTable(chart, part = false) {
  if (chart.type === "superchart") {
    const parts = (chart.elements || []).map((element) => chartTable(element, true))
      .filter(Boolean);
    if (!parts.length) return null;
    return el("details", { class: "chart-data" },
      el("summary", { text: `Chart data: ${chart.title || "subplots"} (${parts.length} parts)` }),
      ...parts);
  }
  const columns = chartColumns(chart);
  if (!columns || !(chart.elements || []).length) return null;
  const [heads, rowsOf] = columns;
  const rows = chart.elements.flatMap(rowsOf);
  const shown = rows.slice(0, CHART_ROWS);
  const table = el("table", { class: "chart-table" },
    el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", { text: h })))),
    el("tbody", {}, ...shown.map((row) => el("tr", {},
      ...row.map((value) => el("td", { text: chartCell(value) }))))));
  const title = `${chart.type.replace(/_/g, " ")}${chart.title ? `: ${chart.title}` : ""}`;
  const count = rows.length === 1 ? "1 row" : `${rows.length} rows`;
  return el("details", { class: "chart-data", open: part },
    el("summary", { text: `Chart data (${title}) · ${count}` }), table,
    rows.length > shown.length
      ? el("p", { class: "muted", text: `${rows.length - shown.length} more rows not shown` })
      : null);
}

// -- rich output -------------------------------------------------------------------------

export function renderMime(container, data, metadata) {
  const mime = MIME_ORDER.find((type) => type in data);
  if (!mime) {
    container.append(el("pre", { class: "output-plain muted",
      text: `[output of type ${Object.keys(data).join(", ") || "none"} not shown]` }));
    return;
  }
  const value = data[mime];
  const meta = metadata[mime] || {};
  if (mime === "text/html") {
    container.append(outputFrame(String(value), "html"));
  } else if (mime === "image/svg+xml") {
    container.append(outputFrame(String(value), "svg"));
  } else if (mime.startsWith("image/")) {
    const img = el("img", { class: "output-image", alt: "image output" });
    img.src = `data:${mime};base64,${String(value).replace(/\s+/g, "")}`;
    if (Number.isFinite(meta.width)) img.width = meta.width;
    if (Number.isFinite(meta.height)) img.height = meta.height;
    container.append(img);
  } else if (mime === "application/json") {
    container.append(el("pre", { class: "output-plain", text: JSON.stringify(value, null, 2) }));
  } else {
    const pre = el("pre", { class: "output-plain" });
    renderAnsi(String(value), pre);
    container.append(pre);
  }
}

const FRAME_STYLE = `
  html,body{margin:0;padding:0;background:#fff;color:#1f2430;
    font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
  body{overflow-x:auto;overflow-y:hidden}
  #replgate-root{display:flow-root;padding:2px 1px}
  table{border-collapse:collapse;border:none;font-size:12px;font-variant-numeric:tabular-nums;margin:2px 0}
  th,td{padding:4px 10px;text-align:right;border:none;white-space:nowrap}
  thead th{border-bottom:1px solid #cfd4dd;font-weight:600}
  tbody th{font-weight:600}
  tbody tr:nth-child(odd){background:#f6f7f9}
  tbody tr:hover{background:#eef1fb}
  img,svg{max-width:100%;height:auto}`;

const FRAME_CSP = [
  "default-src 'none'", `script-src 'nonce-${NONCE}'`, "style-src 'unsafe-inline'",
  "img-src data: blob:", "font-src data:", "media-src data: blob:",
  "connect-src 'none'", "form-action 'none'", "base-uri 'none'",
].join("; ");

// Inside the frame: report the content's height to the page (the only thing it may say).
const FRAME_SCRIPT = `(function(){
  var root=document.getElementById("replgate-root"),last=-1;
  function post(){var h=Math.ceil(root.getBoundingClientRect().height)
    +(document.body.scrollWidth>document.body.clientWidth?14:0);
    if(h!==last){last=h;parent.postMessage({replgateFrameHeight:h},"*");}}
  new ResizeObserver(post).observe(root);addEventListener("load",post);post();})();`;

function outputFrame(markup, kind) {
  // Parse inertly (no script runs, nothing loads), give the content's scripts the nonce so
  // they may run inside the sandbox, and serialise it into the frame's document.
  const parsed = new DOMParser().parseFromString(
    kind === "svg" ? `<body>${markup}</body>` : markup, "text/html");
  for (const script of parsed.querySelectorAll("script")) script.setAttribute("nonce", NONCE);
  const content = parsed.head.innerHTML + parsed.body.innerHTML;
  const doc = `<!doctype html><html><head><meta charset="utf-8">`
    + `<meta http-equiv="Content-Security-Policy" content="${FRAME_CSP}">`
    + `<style>${FRAME_STYLE}</style></head><body><div id="replgate-root">${content}</div>`
    + `<script nonce="${NONCE}">${FRAME_SCRIPT}</script></body></html>`;
  const frame = el("iframe", {
    class: `output-frame ${kind}`, sandbox: "allow-scripts", referrerpolicy: "no-referrer",
    title: kind === "svg" ? "SVG output" : "HTML output", loading: "eager",
  });
  frame.srcdoc = doc;
  frame.style.height = "40px";
  return frame;
}

export function onFrameMessage(event) {
  // Only height reports from our own output frames are heeded, and only as a number.
  const height = event.data && event.data.replgateFrameHeight;
  if (typeof height !== "number" || !Number.isFinite(height)) return;
  for (const frame of document.querySelectorAll("iframe.output-frame")) {
    if (frame.contentWindow === event.source) {
      frame.style.height = `${Math.max(16, Math.min(FRAME_MAX_HEIGHT, height))}px`;
      frame.classList.toggle("capped", height > FRAME_MAX_HEIGHT);
      if (frame.classList.contains("capped")) frame.setAttribute("scrolling", "yes");
      return;
    }
  }
}
