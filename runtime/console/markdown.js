// A small markdown renderer that builds DOM nodes, never HTML: fenced
// code, headings, lists, block quotes, paragraphs, and inline code,
// bold and emphasis. Anything else (HTML tags included) stays text.

import { h } from "./dom.js";

/** Renders `text` as markdown into a fragment. */
export function markdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text ?? "").split("\n");
  let i = 0;
  let para = [];
  const flush = () => {
    if (para.length) out.append(h("p", null, inline(para.join("\n"))));
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w.+-]*)/);
    if (fence) {
      flush();
      const body = [];
      for (++i; i < lines.length && !lines[i].trimStart().startsWith(fence[1]); ++i) body.push(lines[i]);
      ++i;
      const code = h("code", { text: body.join("\n") });
      if (fence[2]) code.dataset.lang = fence[2];
      out.append(h("pre", null, code));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flush();
      // Headings inside a turn stay below the page's own (h4 at most).
      const level = Math.min(6, heading[1].length + 3);
      out.append(h("h" + level, { class: "md-h" }, inline(heading[2])));
      ++i;
      continue;
    }
    if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
      flush();
      const ordered = /^\s*\d/.test(line);
      const list = h(ordered ? "ol" : "ul");
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        list.append(h("li", null, inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ""))));
        ++i;
      }
      out.append(list);
      continue;
    }
    if (/^>\s?/.test(line)) {
      flush();
      const quote = [];
      while (i < lines.length && /^>\s?/.test(lines[i])) quote.push(lines[i++].replace(/^>\s?/, ""));
      out.append(h("blockquote", null, inline(quote.join("\n"))));
      continue;
    }
    if (line.trim() === "") flush();
    else para.push(line);
    ++i;
  }
  flush();
  return out;
}

/** Inline code, **bold** and *emphasis*; the rest as text nodes. */
export function inline(text) {
  const parts = [];
  const re = /(`+)([^`]|[^`][\s\S]*?[^`])\1|\*\*([^*\n]+)\*\*|\*([^*\s][^*\n]*)\*/g;
  let last = 0;
  for (let m; (m = re.exec(text)); ) {
    if (m.index > last) parts.push(text.slice(last, m.index));
    if (m[2] !== undefined) parts.push(h("code", { text: m[2] }));
    else if (m[3] !== undefined) parts.push(h("strong", { text: m[3] }));
    else parts.push(h("em", { text: m[4] }));
    last = re.lastIndex;
  }
  if (last < text.length) parts.push(text.slice(last));
  return parts;
}
