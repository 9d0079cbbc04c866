"""Length distributions and batching rules: parsing, the largest batch, and how often it occurs.

The frequencies are checked against the samplers themselves: torch's ``RandomSampler`` batches for
padding to the longest (a Monte Carlo over many epochs) and transformers' ``LengthGroupedSampler``
for bucketing.
"""

from __future__ import annotations

import json

import pytest

from memfit.core.batch_shapes import longest_batch, read_lengths
from memfit.errors import MemfitError


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_formats_one_count_per_line_histogram_and_json(tmp_path):
    plain = read_lengths(write(tmp_path, "a.txt", "# tokens per sample\n12\n40\n12\n\n7\n"))
    assert (plain.lengths, plain.counts, plain.samples, plain.longest) == ((7, 12, 40), (1, 2, 1), 4, 40)
    hist = read_lengths(write(tmp_path, "b.csv", "7,1\n12 2\n40,1\n"))
    assert (hist.lengths, hist.counts) == (plain.lengths, plain.counts)
    assert read_lengths(write(tmp_path, "c.json", json.dumps([12, 40, 12, 7]))).counts == plain.counts
    assert read_lengths(write(tmp_path, "d.json", json.dumps({"7": 1, "12": 2, "40": 1}))).counts == plain.counts
    assert read_lengths(write(tmp_path, "e.json", json.dumps({"lengths": [7, 12, 12, 40]}))).counts == plain.counts


@pytest.mark.parametrize(("text", "message"), [
    ("12\nabc\n", "line 2: 'abc' is not a token count"),
    ("0\n", "is not a token count"),
    ("12,3,4\n", "expected a token count or 'length,count'"),
    ("# nothing\n", "no sample lengths"),
    ("[1, 2", "not valid JSON"),
    ('"x"', "is not a token count"),
    ('{"lengths": 5}', "expected a list"),
])
def test_bad_lengths_files_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(MemfitError, match=message) as info:
        read_lengths(write(tmp_path, "bad.txt", text))
    assert "\n" not in str(info.value)


def test_rules_and_truncation(tmp_path):
    dist = read_lengths(write(tmp_path, "h.csv", "10,90\n50,9\n200,1\n"))
    pad = longest_batch(dist, rule="pad-longest", micro_batch=4)
    assert (pad.seq_len, pad.micro_batch, pad.batches_per_epoch) == (200, 4, 25)
    assert pad.probability == pytest.approx(4 / 100)  # one sample of 200: in 4 of 100 draws
    cut = longest_batch(dist, rule="pad-longest", micro_batch=4, max_seq_length=40)
    assert (cut.seq_len, cut.truncated) == (40, 10)  # every sample over 40 is cut to 40
    assert cut.probability == pytest.approx(1 - (90 / 100) * (89 / 99) * (88 / 98) * (87 / 97))
    bucket = longest_batch(dist, rule="bucket", micro_batch=4)
    assert (bucket.seq_len, bucket.per_epoch) == (200, pytest.approx(1.0))
    pack = longest_batch(dist, rule="pack", micro_batch=4, max_seq_length=128)
    assert (pack.seq_len, pack.probability) == (128, 1.0)
    assert pack.batches_per_epoch == -(-(-(-(900 + 450 + 200) // 128)) // 4)
    assert longest_batch(dist, rule="pad-longest", micro_batch=4, world_size=2).batches_per_epoch == 13
    for bad in (dict(rule="sorted"), dict(rule="pack")):
        with pytest.raises(MemfitError):
            longest_batch(dist, micro_batch=4, **bad)


def test_pad_longest_frequency_is_what_a_random_sampler_gives():
    torch = pytest.importorskip("torch")
    from memfit.core.batch_shapes import LengthDistribution

    lengths = [10] * 90 + [50] * 9 + [200] * 1
    dist = LengthDistribution(lengths=(10, 50, 200), counts=(90, 9, 1), source="test")
    predicted = longest_batch(dist, rule="pad-longest", micro_batch=4)
    generator = torch.Generator().manual_seed(0)
    hits = batches = 0
    for _ in range(400):  # epochs
        loader = torch.utils.data.DataLoader(lengths, batch_size=4, shuffle=True, generator=generator)
        for batch in loader:
            batches += 1
            hits += int(batch.max()) == predicted.seq_len
    # the one 200-token sample lands in exactly one of each epoch's 25 batches: the sampled frequency is
    # 1/25 whatever the shuffle (observed: equal to the float), so no sampling tolerance (it was 0.008)
    assert hits / batches == pytest.approx(predicted.probability)
    assert max(int(b.max()) for b in torch.utils.data.DataLoader(lengths, batch_size=4)) == predicted.seq_len


def test_bucketing_puts_the_longest_batch_first_as_transformers_does():
    pytest.importorskip("transformers")
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from memfit.core.batch_shapes import LengthDistribution

    lengths = [10] * 90 + [50] * 9 + [200] * 1
    predicted = longest_batch(LengthDistribution((10, 50, 200), (90, 9, 1), "t"), rule="bucket", micro_batch=4)
    order = list(LengthGroupedSampler(4, lengths=lengths, generator=torch.Generator().manual_seed(1)))
    batches = [[lengths[i] for i in order[k:k + 4]] for k in range(0, len(order), 4)]
    assert max(batches[0]) == predicted.seq_len
    assert sum(max(b) == predicted.seq_len for b in batches) == round(predicted.per_epoch)
