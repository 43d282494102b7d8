// A small server-sent events reader (the parts of the format the server
// uses: event, data, comments; any line ending).

export interface SSEMessage {
  event: string;
  data: string;
}

/** The longest event the reader accepts before it gives up. */
export const MAX_EVENT_BYTES = 64 << 20;

/** Splits a byte stream into events. */
export async function* readSSE(body: ReadableStream<Uint8Array>): AsyncGenerator<SSEMessage, void, undefined> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  let buf = "";
  let event = "";
  let data: string[] = [];
  let dataLen = 0;
  let done = false;
  try {
    for (;;) {
      // Take whole lines out of the buffer.
      let start = 0;
      for (;;) {
        let end = -1;
        let next = -1;
        for (let i = start; i < buf.length; i++) {
          const c = buf.charCodeAt(i);
          if (c === 10) {
            end = i;
            next = i + 1;
            break;
          }
          if (c === 13) {
            // A CR at the very end may be the first half of a CRLF.
            if (i + 1 === buf.length && !done) break;
            end = i;
            next = buf.charCodeAt(i + 1) === 10 ? i + 2 : i + 1;
            break;
          }
        }
        if (end < 0) break;
        const line = buf.slice(start, end);
        start = next;
        if (line === "") {
          if (data.length > 0) yield { event: event || "message", data: data.join("\n") };
          event = "";
          data = [];
          dataLen = 0;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event = value;
        else if (field === "data") {
          data.push(value);
          dataLen += value.length;
        }
      }
      buf = buf.slice(start);
      if (buf.length + dataLen > MAX_EVENT_BYTES) throw new Error(`an event is longer than ${MAX_EVENT_BYTES} bytes`);
      if (done) break;
      const r = await reader.read();
      if (r.done) {
        done = true;
        buf += decoder.decode();
        // A final line without its newline still ends; an unterminated
        // event is dropped, as the format says.
        if (buf !== "") buf += "\n";
      } else {
        buf += decoder.decode(r.value, { stream: true });
      }
    }
  } finally {
    if (!done) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}
