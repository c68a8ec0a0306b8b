"""The text the tiny tokenizer is trained on (:mod:`pathprobe.models`): embedded, so
building the tiny model needs nothing from the network."""

# The tokenizer's training text. Plain English on everyday and technical subjects, so
# the vocabulary holds common words and prompts tokenize into sensible pieces.
CORPUS = """\
The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
The capital of Spain is Madrid, and the capital of Japan is Tokyo. London is the capital of the
United Kingdom. Each city has a long history, busy streets, museums, parks and a river or a port.

A request leaves the client, crosses the network, reaches a gateway, and is forwarded to the model
server. The server parses the request, places it in a queue, and the engine schedules it into a
batch. The engine turns the prompt into tokens, runs the prefill, then produces one token at a time
until it reaches the end of the text or the maximum number of tokens. Every step takes time: the
network, the serialization of the message, the time spent waiting in the queue, and the inference
itself. To find where the milliseconds go, measure each part with a monotonic clock and report the
durations, never the absolute times, because the clocks of two machines never agree exactly.

Latency is the time between a question and its answer. Throughput is the number of answers per
second. When more users arrive than the server can handle, requests wait in the queue and latency
grows, even though the work for each request stays the same. A good benchmark separates warm-up
from measurement, runs several rounds, and reports percentiles with confidence intervals.

Once upon a time there was a small village at the edge of a large forest. The people of the village
grew wheat and apples, kept bees, and baked bread every morning. In the winter the snow covered the
roofs and the children played on the frozen lake. In the spring the birds came back, the trees were
green again, and the farmers went out to the fields before the sun was up.

To make a simple soup, cut two onions, three carrots and a few potatoes into small pieces. Warm some
oil in a pot, cook the onions until they are soft, add the other vegetables and cover them with
water. Add salt and pepper, let it boil gently for half an hour, and serve it hot with fresh bread.

The weather today is cloudy with a chance of rain in the afternoon. Tomorrow will be sunny and warm,
with light wind from the west. Temperatures will reach twenty degrees in the city and a little less
near the coast. At night the sky will clear and it will be cold in the valleys.

Hello! How are you today? I am fine, thank you. What would you like to do this weekend? We could go
for a walk in the park, visit the new museum, or watch a film at home. Let me know what you think,
and please tell me if you need anything from the shop on the way back.

Water boils at one hundred degrees Celsius at sea level. The Earth turns around the Sun once a year
and around its own axis once a day. Light travels about three hundred thousand kilometres per
second. A computer stores numbers as bits, and a byte holds eight bits. Memory is fast, disks are
slower, and the network is slower still, so good programs keep the data close to where it is used.

Question: What is two plus two? Answer: Two plus two is four.
Question: What colour is the sky on a clear day? Answer: The sky is blue.
Question: Who wrote the letter? Answer: The letter was written by my grandmother in nineteen fifty.
Question: Where is the station? Answer: The station is at the end of this street, next to the bank.

The system administrator opened a terminal, checked the logs, and found that the service had
restarted three times during the night. The error said that the connection was refused by the
upstream host. After a short investigation she found a wrong port number in the configuration file,
fixed it, deployed the new version, and watched the graphs until the error rate went back to zero.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, 1))

{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0.0, "stream": true}

Numbers and dates: 0 1 2 3 4 5 6 7 8 9 10 12 16 32 64 100 128 256 512 1000 1024 2048 4096 8192.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday. January, February, March, April,
May, June, July, August, September, October, November and December.

Good stories have a beginning, a middle and an end. The hero leaves home, meets a friend, faces a
problem that seems too big, learns something new, and comes back changed. Readers like characters
who want something and who have to work for it. Short sentences keep the pace. Long sentences, with
many clauses and a slow rhythm, give the reader time to look around and to feel the place.

Science asks questions and tests answers against the world. An experiment changes one thing at a
time and measures what happens. If the result surprises you, repeat it, check the instruments, and
ask a colleague to look at the method. Write down what you did so that someone else can do it again.
"""
