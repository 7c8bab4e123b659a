// Building the page without HTML strings: every piece of text from the
// server goes in through textContent (or a text node), so nothing a
// thread, a turn or a task holds is ever parsed as markup.

/** An element: h("div", {class: "x", onclick: f}, child, "text", ...). */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null || value === false) continue;
      if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (key === "class") el.className = value;
      else if (key === "text") el.textContent = value;
      else if (key in el && key !== "list" && key !== "form") el[key] = value;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Appends children (elements, strings, arrays, null skipped). */
export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replaces every child of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export const $ = (sel, root = document) => root.querySelector(sel);

/** "12:04:31" today, else "2026-11-25 12:04". */
export function when(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const today = new Date();
  if (d.toDateString() === today.toDateString()) return time;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time.slice(0, 5)}`;
}

/** A <time> element with the full date in its title. */
export function timeEl(ms) {
  if (!ms) return null;
  return h("time", { datetime: new Date(ms).toISOString(), title: new Date(ms).toString(), text: when(ms) });
}
