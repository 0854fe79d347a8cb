// Appended to a copy of an HTML report by .ci/browser_check.sh (the report itself has no script):
// at the window's width, no table is cut off at the page's right edge and no two labels of the
// frontier plot overlap. The verdict is written into the page, which --dump-dom prints.
(function () {
  const problems = [];
  const width = document.documentElement.clientWidth;
  document.querySelectorAll("table").forEach((t, i) => {
    const box = t.getBoundingClientRect();
    const holder = t.parentElement;
    const cut = holder.classList.contains("scroll") ? holder.scrollWidth > holder.clientWidth + 1 : box.right > width + 1;
    if (cut && !holder.classList.contains("scroll-ok")) {
      const head = (t.querySelector("th") || {}).textContent || "";
      problems.push(`table ${i} (${head.trim()}) is cut: ${Math.round(box.width)} px wide, ${width} px of page`);
    }
  });
  document.querySelectorAll("svg").forEach((svg, s) => {
    const boxes = [...svg.querySelectorAll("text")].map((t) => [t.textContent, t.getBoundingClientRect()]);
    for (let i = 0; i < boxes.length; i++) {
      for (let j = i + 1; j < boxes.length; j++) {
        const [ta, a] = boxes[i], [tb, b] = boxes[j];
        const overlap = a.x < b.x + b.width - 0.5 && b.x < a.x + a.width - 0.5 &&
                        a.y < b.y + b.height - 0.5 && b.y < a.y + a.height - 0.5;
        if (overlap && a.width && b.width) problems.push(`svg ${s}: "${ta}" overlaps "${tb}"`);
      }
    }
  });
  const out = document.createElement("pre");
  out.id = "layout-check";
  out.textContent = problems.length ? problems.join("\n") : "layout ok";
  document.body.appendChild(out);
})();
