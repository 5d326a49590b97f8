//! What arrives over the network, as random and mutated bytes (a stable
//! stand-in for `fuzz/fuzz_targets/wire.rs`, which needs nightly and
//! cargo-fuzz): every decoder and every check of what a message carries
//! answers with an error or a refusal, never a panic.

use fedweave_net::wire::{self, Answer, Envelope, FetchRequest, Hello, Poll, Post, Reply, Task};
use fedweave_sim::runtime::{ClientInfo, Derived, Score, check_hello, check_score};
use prost::Message;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Random bytes, or a valid encoding with a few bytes flipped, cut or
/// appended.
fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    if rng.below(4) == 0 {
        let n = rng.below(64);
        return (0..n).map(|_| rng.next() as u8).collect();
    }
    let mut b = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        match rng.below(3) {
            0 if !b.is_empty() => {
                let k = rng.below(b.len());
                b[k] = rng.next() as u8;
            }
            1 if !b.is_empty() => {
                let k = rng.below(b.len());
                b.truncate(k);
            }
            _ => b.push(rng.next() as u8),
        }
    }
    b
}

#[test]
fn hostile_bytes_are_errors_or_refusals_never_panics() {
    let cfg = crate::common::config("pfedgraph", &[]);
    let derived = Derived::load(&cfg).unwrap();
    let info = derived.info(1);
    let score = Score::default();
    let seeds: Vec<Vec<u8>> = vec![
        wire::encode(&info).unwrap(),
        wire::encode(&score).unwrap(),
        wire::encode(&Task::<Vec<f32>>::Train {
            seq: 2,
            round: 1,
            participate: true,
            before: true,
            after: true,
            origin: false,
        })
        .unwrap(),
        wire::encode(&Reply::<Vec<f32>>::Trained {
            upload: Some(wire::WireUpload {
                up: vec![0.5; 7],
                loss: 0.1,
                origin: Some(vec![1.0; 7]),
            }),
            before: Some(score),
            after: None,
        })
        .unwrap(),
        Hello {
            id: 3,
            token: "t".into(),
            info: vec![1, 2, 3],
            previous: vec![9; 16],
        }
        .encode_to_vec(),
        Post {
            state: 2,
            payload: vec![1u8; 9].into(),
            latest: 7,
        }
        .encode_to_vec(),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut decoded = [0usize; 4];
    for _ in 0..40_000 {
        let data = mutate(&mut rng, &seeds);
        let _ = Hello::decode(&data[..]);
        let _ = Poll::decode(&data[..]);
        let _ = Answer::decode(&data[..]);
        let _ = Envelope::decode(&data[..]);
        let _ = FetchRequest::decode(&data[..]);
        let _ = Post::decode(&data[..]);
        if wire::decode::<Task<Vec<f32>>>(&data, 1 << 20).is_ok() {
            decoded[0] += 1;
        }
        if let Ok(Reply::Trained { before, after, .. }) =
            wire::decode::<Reply<Vec<f32>>>(&data, 1 << 20)
        {
            decoded[1] += 1;
            for s in before.into_iter().chain(after) {
                let _ = check_score(&s, false);
                let _ = check_score(&s, true);
            }
        }
        if let Ok(s) = wire::decode::<Score>(&data, 1 << 20) {
            decoded[2] += 1;
            let _ = check_score(&s, false);
        }
        if let Ok(got) = wire::decode::<ClientInfo>(&data, 1 << 20) {
            decoded[3] += 1;
            let _ = check_hello(&info, true, &got, 1000);
            let _ = check_hello(&info, false, &got, usize::MAX);
            let _ = check_hello(&got, false, &got, 1000);
        }
        let _ = fedweave_net::auth::cert_identity(&data);
        let text = String::from_utf8_lossy(&data);
        let _ = wire::unhex(&text);
        let _ = fedweave_net::auth::Credential::parse(&text).map(|c| c.matches(&text));
    }
    // The mutations reach past the first byte of each format.
    assert!(decoded.iter().all(|&n| n > 0), "{decoded:?}");
}
