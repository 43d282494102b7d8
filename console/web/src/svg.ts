// A tiny SVG builder, as dom.ts's h() for HTML: strings become text
// nodes, attributes are set one by one, and no markup is parsed. Charts
// take their geometry from attributes and their colours from classes.

const NS = "http://www.w3.org/2000/svg";

export type SvgChild = Node | string | number | null | undefined | false | SvgChild[];
export type SvgAttrs = Record<string, string | number | boolean | null | undefined>;

export function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs?: SvgAttrs | null, ...children: SvgChild[]): SVGElementTagNameMap[K] {
  const el = document.createElementNS(NS, tag);
  if (attrs) {
    for (const name of Object.keys(attrs)) {
      const v = attrs[name];
      if (v === null || v === undefined || v === false) continue;
      const lower = name.toLowerCase();
      if (lower.startsWith("on") || lower === "style" || lower === "href" || lower === "xlink:href") {
        throw new Error("svg: attribute " + name + " is not allowed");
      }
      el.setAttribute(name, v === true ? "" : String(v));
    }
  }
  add(el, children);
  return el;
}

function add(parent: Node, children: SvgChild[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) add(parent, c);
    else if (typeof c === "string" || typeof c === "number") parent.appendChild(document.createTextNode(String(c)));
    else parent.appendChild(c);
  }
}
