// Server-Sent Events from a fetch() body, read as the WHATWG spec reads them: lines end in
// CRLF, LF or CR (a CRLF split across two chunks is one line ending), a blank line
// dispatches, ":" lines are comments, several data lines join with "\n", one space after
// the colon is dropped. EventSource cannot POST, so the pipeline page reads the stream itself.

export function createSSEParser(onEvent) {
  let buffer = "";
  let data = [];
  let event = "";
  let started = false;

  function line(text) {
    if (text === "") {
      if (data.length) onEvent({ event: event || "message", data: data.join("\n") });
      data = [];
      event = "";
      return;
    }
    if (text.startsWith(":")) return;
    const colon = text.indexOf(":");
    const name = colon === -1 ? text : text.slice(0, colon);
    let value = colon === -1 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "data") data.push(value);
    else if (name === "event") event = value;
  }

  function drain(final) {
    let start = 0;
    for (;;) {
      const cr = buffer.indexOf("\r", start);
      const lf = buffer.indexOf("\n", start);
      if (cr === -1 && lf === -1) break;
      let end;
      let next;
      if (cr !== -1 && (lf === -1 || cr < lf)) {
        if (cr + 1 === buffer.length && !final) break; // maybe the first half of \r\n
        end = cr;
        next = buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
      } else {
        end = lf;
        next = lf + 1;
      }
      line(buffer.slice(start, end));
      start = next;
    }
    buffer = buffer.slice(start);
  }

  return {
    push(text) {
      if (!started) {
        text = text.replace(/^\uFEFF/, "");
        started = text.length > 0;
      }
      buffer += text;
      drain(false);
    },
    end() {
      drain(true);
    },
  };
}

export async function readSSE(response, onEvent) {
  const parser = createSSEParser(onEvent);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    parser.push(decoder.decode(value, { stream: true }));
  }
  parser.push(decoder.decode());
  parser.end();
}
