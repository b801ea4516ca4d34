// A chat page on LangGraph's useStream, built the way Agent Chat UI builds its thread view: the
// same hook, options and submit calls (fetchStateHistory, an onCustomEvent listener, messages as
// text blocks with their own ids, regenerate from the checkpoint before an answer, an interrupt
// resumed with command.resume). Served from an origin of its own, it calls Trellis's /lg
// cross-origin with a token, as a front end on its own port does.
import React, { useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/langgraph-sdk/react";

const params = new URLSearchParams(window.location.search);
const apiUrl = params.get("api");
const apiKey = params.get("key");
const assistantId = params.get("assistant");
let sent = 0;

function textOf(message) {
  if (typeof message.content === "string") return message.content;
  return message.content.map((block) => (typeof block === "string" ? block : block.text ?? "")).join("");
}

function App() {
  const [threadId, setThreadId] = useState(null);
  const [server, setServer] = useState("");
  const [draft, setDraft] = useState("");
  const [customEvents, setCustomEvents] = useState(0);

  useEffect(() => {
    fetch(`${apiUrl}/info`, { headers: { "X-Api-Key": apiKey } })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(String(r.status)))))
      .then((info) => setServer(info.server))
      .catch((error) => setServer(`unreachable: ${error.message}`));
  }, []);

  const stream = useStream({
    apiUrl,
    apiKey,
    assistantId,
    threadId,
    onThreadId: setThreadId,
    fetchStateHistory: true,
    onCustomEvent: () => setCustomEvents((n) => n + 1),
  });

  // what Agent Chat UI sends for a new message, and for an edit (from the checkpoint before it)
  const submitText = (text, checkpoint) => {
    sent += 1;
    const message = { id: `typed-${sent}`, type: "human", content: [{ type: "text", text }] };
    stream.submit(
      { messages: [message] },
      {
        ...(checkpoint !== undefined ? { checkpoint } : {}),
        streamMode: ["values"],
        streamSubgraphs: true,
        streamResumable: true,
        optimisticValues: (prev) => ({ ...prev, messages: [...(prev.messages ?? []), message] }),
      },
    );
    setDraft("");
  };

  const send = (event) => {
    event.preventDefault();
    submitText(draft);
  };

  return (
    <main data-thread={threadId ?? ""} data-loading={String(stream.isLoading)} data-custom={customEvents}>
      <p id="server">{server}</p>
      {stream.error ? <p id="error">{String(stream.error?.message ?? stream.error)}</p> : null}
      <ol id="messages">
        {stream.messages.map((message, index) => {
          const parent = stream.getMessagesMetadata(message, index)?.firstSeenState?.parent_checkpoint;
          return (
            <li key={message.id ?? index} data-type={message.type} data-id={message.id ?? ""}>
              <span className="text">{textOf(message)}</span>
              {message.type === "human" && !stream.isLoading ? (
                <button className="edit" onClick={() => submitText(draft, parent ?? null)}>Edit</button>
              ) : null}
              {message.type === "ai" && parent && !stream.isLoading ? (
                <button className="regenerate" onClick={() => stream.submit(undefined, {
                  checkpoint: parent, streamMode: ["values"], streamSubgraphs: true, streamResumable: true,
                })}>Regenerate</button>
              ) : null}
            </li>
          );
        })}
      </ol>
      {stream.interrupt && !stream.isLoading ? (
        <div id="interrupt">
          <button id="approve" onClick={() => stream.submit(undefined, {
            command: { resume: { decisions: [{ type: "approve" }] } }, streamMode: ["values"],
          })}>Approve</button>
        </div>
      ) : null}
      <form onSubmit={send}>
        <input id="draft" value={draft} onChange={(event) => setDraft(event.target.value)} />
        <button id="send" type="submit" disabled={stream.isLoading || !draft}>Send</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
