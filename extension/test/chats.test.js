import assert from "node:assert/strict";
import { test } from "node:test";

import { ChatStore, MAX_CHATS, memoryArea, newChat, titleFor } from "../chats.js";

test("a chat is listed once it has a question, titled by it, newest first", async () => {
  const store = new ChatStore(memoryArea());
  const a = newChat();
  await store.save(a);
  assert.deepEqual(await store.list(), []); // an empty chat is not listed
  a.turns.push({ message: "What does ERR_7731 mean?" });
  await store.save(a);
  const b = newChat();
  b.turns.push({ message: "Garage hours" });
  await store.save(b);
  const list = await store.list();
  assert.deepEqual(list.map((c) => c.title), ["Garage hours", "What does ERR_7731 mean?"]);
  assert.equal((await store.get(a.id)).turns[0].message, "What does ERR_7731 mean?");
});

test("rename keeps the chosen title; an empty name goes back to the question", async () => {
  const store = new ChatStore(memoryArea());
  const chat = newChat();
  chat.turns.push({ message: "first question" });
  await store.save(chat);
  await store.rename(chat.id, "  Flux notes ");
  chat.turns.push({ message: "second" });
  await store.save({ ...(await store.get(chat.id)), turns: chat.turns });
  assert.equal((await store.list())[0].title, "Flux notes");
  await store.rename(chat.id, "");
  assert.equal((await store.list())[0].title, "first question");
});

test("delete removes the chat, its list entry and the current pointer", async () => {
  const area = memoryArea();
  const store = new ChatStore(area);
  const chat = newChat();
  chat.turns.push({ message: "q" });
  await store.save(chat);
  await store.setCurrent(chat.id);
  assert.equal((await store.current()).id, chat.id);
  await store.remove(chat.id);
  assert.equal(await store.get(chat.id), null);
  assert.deepEqual(await store.list(), []);
  assert.equal(await store.current(), null);
});

test("only the newest MAX_CHATS are kept", async () => {
  const area = memoryArea();
  const store = new ChatStore(area);
  const first = newChat();
  first.turns.push({ message: "oldest" });
  await store.save(first);
  for (let i = 0; i < MAX_CHATS; i += 1) {
    const c = newChat();
    c.turns.push({ message: `q${i}` });
    await store.save(c);
  }
  const list = await store.list();
  assert.equal(list.length, MAX_CHATS);
  assert.equal(await store.get(first.id), null);
});

test("titles are the first line of the first question, cut at a word", () => {
  assert.equal(titleFor([]), "New chat");
  assert.equal(titleFor([{ message: "short\nsecond line" }]), "short");
  const long = titleFor([{ message: "why does the flux capacitor overheat when the garage is warm in winter months" }]);
  assert.ok(long.endsWith("…") && long.length <= 61, long);
});
