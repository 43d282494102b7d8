// xterm.js under the console's Content Security Policy (style-src 'self',
// no 'unsafe-inline').
//
// xterm.js 6.0.0 styles its DOM renderer and its scrollbar with <style>
// elements it makes at run time (in Viewport and DomRenderer: the
// scrollbar's colours, the theme's colours and fonts, the rows' spans),
// which the policy refuses ("Refused to apply inline style ..."), leaving
// the terminal unstyled. build.mjs rewrites those three
// `document.createElement("style")` calls in the bundled xterm.mjs into
// calls to styleSheet below, and its one style="..." attribute (24-bit
// colours, set with setAttribute) into a CSSOM assignment. Stylesheets
// constructed in script and adopted by the document, and the CSSOM, are
// not inline style: the policy lets them be.

// styleSheet stands in for a <style> element: xterm appends it, sets its
// textContent and removes it; its text goes to a constructed stylesheet
// adopted by doc for as long as the element is not removed.
export function styleSheet(doc: Document): HTMLElement {
  // An inert element in place of the <style> (never rendered, no text).
  const el = doc.createElement("template");
  const sheet = new CSSStyleSheet();
  let text = "";
  doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
  Object.defineProperty(el, "textContent", {
    configurable: true,
    get: () => text,
    set: (v: unknown) => {
      text = v === null || v === undefined ? "" : String(v);
      sheet.replaceSync(text);
    },
  });
  el.remove = () => {
    doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => s !== sheet);
    Element.prototype.remove.call(el);
  };
  return el;
}
