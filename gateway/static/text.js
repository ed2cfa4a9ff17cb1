/* Text as styled spans, never HTML: ANSI escape codes and Python highlighting. */

import { el } from "./page.js";

// -- ANSI escape codes -> styled spans ---------------------------------------------------

const ANSI_NAMES = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"];
// eslint-disable-next-line no-control-regex
export const ANSI_RE = /\x1b\[([0-9;:?]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]/g;

function ansi256(n) {
  if (n < 16) return { name: (n < 8 ? "" : "bright-") + ANSI_NAMES[n % 8] };
  if (n < 232) {
    const c = n - 16;
    const level = (v) => (v === 0 ? 0 : 55 + v * 40);
    return { rgb: [level(Math.floor(c / 36)), level(Math.floor(c / 6) % 6), level(c % 6)] };
  }
  const grey = 8 + (n - 232) * 10;
  return { rgb: [grey, grey, grey] };
}

function applySgr(style, params) {
  const codes = params === "" ? [0] : params.split(/[;:]/).map((p) => (p === "" ? 0 : Number(p)));
  for (let i = 0; i < codes.length; i += 1) {
    const code = codes[i];
    if (code === 0) Object.assign(style, { fg: null, bg: null, bold: false, dim: false,
      italic: false, underline: false, inverse: false });
    else if (code === 1) style.bold = true;
    else if (code === 2) style.dim = true;
    else if (code === 3) style.italic = true;
    else if (code === 4) style.underline = true;
    else if (code === 7) style.inverse = true;
    else if (code === 22) { style.bold = false; style.dim = false; }
    else if (code === 23) style.italic = false;
    else if (code === 24) style.underline = false;
    else if (code === 27) style.inverse = false;
    else if (code >= 30 && code <= 37) style.fg = { name: ANSI_NAMES[code - 30] };
    else if (code === 39) style.fg = null;
    else if (code >= 40 && code <= 47) style.bg = { name: ANSI_NAMES[code - 40] };
    else if (code === 49) style.bg = null;
    else if (code >= 90 && code <= 97) style.fg = { name: `bright-${ANSI_NAMES[code - 90]}` };
    else if (code >= 100 && code <= 107) style.bg = { name: `bright-${ANSI_NAMES[code - 100]}` };
    else if (code === 38 || code === 48) {
      let color = null;
      if (codes[i + 1] === 5 && i + 2 < codes.length) {
        color = ansi256(codes[i + 2] & 255);
        i += 2;
      } else if (codes[i + 1] === 2 && i + 4 < codes.length) {
        color = { rgb: codes.slice(i + 2, i + 5).map((v) => Math.max(0, Math.min(255, v | 0))) };
        i += 4;
      }
      if (code === 38) style.fg = color; else style.bg = color;
    }
  }
}

function styledSpan(text, style) {
  let { fg, bg } = style;
  if (style.inverse) [fg, bg] = [bg || { name: "inverse-fg" }, fg || { name: "inverse-bg" }];
  const classes = [];
  const span = document.createElement("span");
  if (fg && fg.name) classes.push(`ansi-fg-${fg.name}`);
  if (bg && bg.name) classes.push(`ansi-bg-${bg.name}`);
  if (fg && fg.rgb) span.style.color = `rgb(${fg.rgb.join(",")})`;
  if (bg && bg.rgb) span.style.backgroundColor = `rgb(${bg.rgb.join(",")})`;
  if (style.bold) classes.push("ansi-bold");
  if (style.dim) classes.push("ansi-dim");
  if (style.italic) classes.push("ansi-italic");
  if (style.underline) classes.push("ansi-underline");
  span.className = classes.join(" ");
  span.textContent = text;
  return span;
}

function isPlain(style) {
  return !style.fg && !style.bg && !style.bold && !style.dim && !style.italic
    && !style.underline && !style.inverse;
}

/** Render text with ANSI SGR colours into `target` as text nodes and spans (never HTML). */
export function renderAnsi(text, target) {
  const style = { fg: null, bg: null, bold: false, dim: false, italic: false,
    underline: false, inverse: false };
  const parts = [];
  let last = 0;
  const emit = (chunk) => {
    if (!chunk) return;
    parts.push(isPlain(style) ? document.createTextNode(chunk) : styledSpan(chunk, style));
  };
  ANSI_RE.lastIndex = 0;
  for (let match = ANSI_RE.exec(text); match; match = ANSI_RE.exec(text)) {
    emit(text.slice(last, match.index));
    last = ANSI_RE.lastIndex;
    if (match[2] === "m") applySgr(style, match[1]);
  }
  emit(text.slice(last));
  target.replaceChildren(...parts);
}

export function fixCarriageReturns(text) {
  // As Jupyter does: a bare \r returns to the start of the line, overwriting it.
  return text.replace(/\r+\n/g, "\n").replace(/^.*\r+/gm, "");
}

// -- Python highlighting (as spans; the code is only ever text) --------------------------

const PY_KEYWORDS = new Set(("False None True and as assert async await break class continue "
  + "def del elif else except finally for from global if import in is lambda nonlocal not or "
  + "pass raise return try while with yield match case").split(" "));
const PY_BUILTINS = new Set(("print len range open int str float list dict set tuple bool "
  + "type isinstance enumerate zip map filter sorted sum min max abs any all repr super "
  + "object Exception ValueError TypeError KeyError RuntimeError self").split(" "));
const PY_TOKEN = new RegExp([
  /(#[^\n]*)/.source,
  /((?:\b[rRbBuUfF]{1,2})?(?:'''[\s\S]*?(?:'''|$(?![\s\S]))|"""[\s\S]*?(?:"""|$(?![\s\S]))|'(?:\\.|[^'\\\n])*'?|"(?:\\.|[^"\\\n])*"?))/.source,
  /(\b(?:0[xXoObB][\da-fA-F_]+|\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?j?)\b)/.source,
  /(@[A-Za-z_][\w.]*)/.source,
  /([A-Za-z_]\w*)/.source,
].join("|"), "g");

export function highlightPython(code) {
  const fragment = document.createDocumentFragment();
  let last = 0;
  let previousWord = "";
  const span = (cls, text) => fragment.append(el("span", { class: cls, text }));
  PY_TOKEN.lastIndex = 0;
  for (let m = PY_TOKEN.exec(code); m; m = PY_TOKEN.exec(code)) {
    if (m[0] === "") { PY_TOKEN.lastIndex += 1; continue; }
    fragment.append(document.createTextNode(code.slice(last, m.index)));
    last = PY_TOKEN.lastIndex;
    if (m[1]) span("tok-comment", m[1]);
    else if (m[2]) span("tok-string", m[2]);
    else if (m[3]) span("tok-number", m[3]);
    else if (m[4]) span("tok-decorator", m[4]);
    else {
      const word = m[5];
      if (previousWord === "def" || previousWord === "class") span("tok-def", word);
      else if (PY_KEYWORDS.has(word)) span("tok-keyword", word);
      else if (PY_BUILTINS.has(word)) span("tok-builtin", word);
      else fragment.append(document.createTextNode(word));
      previousWord = word;
      continue;
    }
    previousWord = "";
  }
  fragment.append(document.createTextNode(code.slice(last)));
  return fragment;
}
