// Markdown to safe HTML for the playground's answers: fenced code blocks (with their language
// named), headings, lists, block quotes, tables, rules, paragraphs, and inline code, bold,
// italics, strike-through and links. Every piece of text is escaped before any tag is added, so
// a model's output can never inject markup; links keep only http(s) and mailto targets.
// An unclosed fence (a stream still writing its code) renders as code up to the end.
"use strict";

const Markdown = (() => {
  const escapeHtml = (s) =>
    s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

  // Bold, italics and strike-through of escaped text with no tags in it.
  function emphasis(s) {
    s = s.replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>").replace(/__([^_]+)__/g, "<strong>$1</strong>");
    s = s.replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>");
    s = s.replace(/(^|[^\w_])_([^_\s][^_]*)_(?=[^\w]|$)/g, "$1<em>$2</em>");
    return s.replace(/~~([^~]+)~~/g, "<del>$1</del>");
  }

  // Inline spans of one line of escaped-later text. Code spans are cut out first so that their
  // contents are never read as emphasis.
  function inline(text) {
    const parts = text.split(/(`+[^`]*?`+)/);
    return parts
      .map((part, i) => {
        if (i % 2 === 1) {
          const ticks = part.match(/^`+/)[0].length;
          return `<code>${escapeHtml(part.slice(ticks, part.length - ticks))}</code>`;
        }
        // A link's tag stands aside as a placeholder while emphasis is read, so that `*`, `_`
        // and `~` in its href never become tags inside the attribute; its label is read alone.
        const links = [];
        let s = escapeHtml(part.replace(/\u0000/g, ""));
        s = s.replace(/\[([^\]]+)\]\(([^)\s]+)\)/g, (m, label, href) => {
          const safe = /^(https?:|mailto:)/i.test(href) ? href : null;
          if (!safe) return label;
          links.push(`<a href="${safe}" target="_blank" rel="noopener noreferrer">${emphasis(label)}</a>`);
          return `\u0000${links.length - 1}\u0000`;
        });
        s = emphasis(s);
        return s.replace(/\u0000(\d+)\u0000/g, (m, n) => links[Number(n)]);
      })
      .join("");
  }

  const isTableRule = (line) => /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/.test(line);
  const cells = (line) => line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());

  function render(source) {
    const lines = source.replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let paragraph = [];
    const flush = () => {
      if (paragraph.length) out.push(`<p>${paragraph.map(inline).join("<br>")}</p>`);
      paragraph = [];
    };
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
      if (fence) {
        flush();
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        i += 1;
        const lang = fence[2] ? `<span class="code-lang">${escapeHtml(fence[2])}</span>` : "";
        const cls = fence[2] ? ` class="language-${escapeHtml(fence[2])}"` : "";
        out.push(`<pre class="code">${lang}<code${cls}>${escapeHtml(body.join("\n"))}</code></pre>`);
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        flush();
        const level = heading[1].length;
        out.push(`<h${level}>${inline(heading[2])}</h${level}>`);
        i += 1;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        flush();
        out.push("<hr>");
        i += 1;
        continue;
      }
      if (/^\s*>/.test(line)) {
        flush();
        const quoted = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
        out.push(`<blockquote>${render(quoted.join("\n"))}</blockquote>`);
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && isTableRule(lines[i + 1])) {
        flush();
        const head = cells(line).map((c) => `<th>${inline(c)}</th>`).join("");
        const rows = [];
        i += 2;
        while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
          rows.push(`<tr>${cells(lines[i++]).map((c) => `<td>${inline(c)}</td>`).join("")}</tr>`);
        }
        out.push(`<table><thead><tr>${head}</tr></thead><tbody>${rows.join("")}</tbody></table>`);
        continue;
      }
      const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
      if (item) {
        flush();
        const ordered = /\d/.test(item[1]);
        const items = [];
        while (i < lines.length) {
          const m = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
          if (m && /\d/.test(m[1]) === ordered) {
            items.push(m[2]);
          } else if (items.length && /^\s{2,}\S/.test(lines[i])) {
            items[items.length - 1] += ` ${lines[i].trim()}`;
          } else {
            break;
          }
          i += 1;
        }
        const tag = ordered ? "ol" : "ul";
        out.push(`<${tag}>${items.map((t) => `<li>${inline(t)}</li>`).join("")}</${tag}>`);
        continue;
      }
      if (!line.trim()) {
        flush();
      } else {
        paragraph.push(line);
      }
      i += 1;
    }
    flush();
    return out.join("\n");
  }

  return { render, escapeHtml };
})();
