// Building the page from data. Untrusted text (prompts, model and tool output, names)
// only ever goes in as text nodes: nothing here parses a string as HTML.

/** `el("li", {class: "row", "aria-label": "..."}, child, "text", ...)`; strings become
 * text nodes, attributes are set one by one (never an `on*` handler or `style`). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") || name === "style") throw new Error(`el: ${name} is not set here`);
    node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, ...children);
  return node;
}

export function append(node, ...children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

export function $(id) {
  return document.getElementById(id);
}

/** A `<dl>` of [term, value] pairs. */
export function facts(node, pairs) {
  clear(node);
  for (const [term, value] of pairs) append(node, el("dt", {}, term), el("dd", {}, value));
}

export function fmtTime(epoch) {
  if (typeof epoch !== "number") return "n/a";
  return new Date(epoch * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function fmtSeconds(seconds) {
  if (typeof seconds !== "number") return "n/a";
  return seconds < 10 ? `${seconds.toFixed(2)} s` : `${seconds.toFixed(1)} s`;
}

export function fmtInt(value) {
  return typeof value === "number" ? String(value) : "n/a";
}

export function fmtUsd(value) {
  if (typeof value !== "number") return "n/a";
  return value < 0.01 && value > 0 ? `$${value.toFixed(6)}` : `$${value.toFixed(4)}`;
}

export function short(text, n = 120) {
  const s = String(text ?? "");
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}
