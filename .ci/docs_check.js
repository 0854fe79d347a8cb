// Loaded by a copy of every page of the built docs site (.ci/browser_check.sh): at the window's
// width (1400 px), no numbered list restarts, no code block is cut (scrolls), no name in a table
// breaks mid-word and no table is cut. The verdict is written into the page, which --dump-dom prints.
(function () {
  const problems = [];
  const main = document.querySelector("article") || document.body;
  main.querySelectorAll("ol").forEach((ol) => {
    for (let s = ol.previousElementSibling; s && !/^H[1-6]$/.test(s.tagName); s = s.previousElementSibling) {
      if (s.tagName === "OL") { problems.push(`a numbered list restarts at "${ol.textContent.trim().slice(0, 40)}"`); break; }
    }
  });
  main.querySelectorAll("pre").forEach((pre) => {
    const code = pre.querySelector("code") || pre;
    if (code.scrollWidth > code.clientWidth + 1) {
      problems.push(`a code block is cut: ${code.scrollWidth} px in ${code.clientWidth} px, "${code.textContent.trim().slice(0, 40)}"`);
    }
  });
  main.querySelectorAll("td code, th code").forEach((c) => {
    const text = c.firstChild;
    if (!text || text.nodeType !== Node.TEXT_NODE || c.getClientRects().length < 2) return;
    const range = document.createRange();
    let top = null;
    for (let i = 0; i < text.length; i++) {
      range.setStart(text, i); range.setEnd(text, i + 1);
      const box = range.getBoundingClientRect();
      if (top !== null && box.top > top + 1 && !/[\s\-]/.test(text.data[i - 1])) {
        problems.push(`"${text.data}" breaks mid-word in a table ("${text.data.slice(0, i)}|${text.data.slice(i)}")`);
        break;
      }
      top = box.top;
    }
  });
  main.querySelectorAll("table").forEach((t) => {
    const holder = t.parentElement;
    if (holder.scrollWidth > holder.clientWidth + 1 || t.getBoundingClientRect().right > document.documentElement.clientWidth + 1) {
      problems.push(`a table is cut: "${((t.querySelector("th") || {}).textContent || "").trim()}"`);
    }
  });
  const out = document.createElement("pre");
  out.id = "docs-check";
  out.textContent = problems.length ? problems.join("\n") : "docs ok";
  document.body.appendChild(out);
})();
