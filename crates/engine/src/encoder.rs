//! The vision tower's work, scheduled by the engine: a request with images must not stall the
//! others' steps beyond a prefill chunk's budget. Each image goes through the tower a step
//! at a time ([`Encoding`]: the patch embedding, half a ViT block, or the aligner); every engine
//! step first runs tower steps, oldest image first, until their rows reach the step's token
//! budget (at least one step), then its model step. A request waits outside the scheduler
//! until its last image is encoded. An image that several waiting requests hold (a chat
//! request's `n` choices) is encoded once.

use std::collections::VecDeque;
use std::sync::Arc;

use deepinfer_model::vision::{EncodedImage, Encoding, ImagePlan, Pixels, VisionTower};

use crate::request::RequestId;

pub struct ImageEncoder {
    tower: Arc<VisionTower>,
    jobs: VecDeque<Job>,
}

struct Job {
    digest: [u8; 32],
    encoding: Encoding,
    /// The requests waiting for this image.
    waiters: Vec<RequestId>,
}

/// An image through the tower, and the requests that wait for it.
pub struct Encoded {
    pub digest: [u8; 32],
    pub image: EncodedImage,
    pub waiters: Vec<RequestId>,
}

impl ImageEncoder {
    pub fn new(tower: Arc<VisionTower>) -> Self {
        Self {
            tower,
            jobs: VecDeque::new(),
        }
    }

    pub fn tower(&self) -> &VisionTower {
        &self.tower
    }

    /// Queues `pixels` (planned as `plan`) for request `id`, or adds `id` to the requests
    /// waiting for the same image.
    pub fn submit(
        &mut self,
        id: RequestId,
        digest: [u8; 32],
        pixels: &Arc<Pixels>,
        plan: ImagePlan,
    ) {
        if let Some(job) = self.jobs.iter_mut().find(|j| j.digest == digest) {
            if !job.waiters.contains(&id) {
                job.waiters.push(id);
            }
            return;
        }
        self.jobs.push_back(Job {
            digest,
            encoding: self.tower.begin(pixels.clone(), plan),
            waiters: vec![id],
        });
    }

    /// Request `id` no longer waits; an image nobody waits for is dropped.
    pub fn cancel(&mut self, id: RequestId) {
        for job in &mut self.jobs {
            job.waiters.retain(|&w| w != id);
        }
        self.jobs.retain(|j| !j.waiters.is_empty());
    }

    pub fn has_work(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// Runs tower steps, oldest image first, while their rows (each step's are its image's
    /// patches) stay within `budget`, and at least one; returns the images finished.
    pub fn step(&mut self, budget: usize) -> Vec<Encoded> {
        let (mut spent, mut done) = (0, Vec::new());
        while let Some(job) = self.jobs.front_mut() {
            let rows = job.encoding.plan().patches();
            if spent > 0 && spent + rows > budget {
                break;
            }
            self.tower.advance(&mut job.encoding);
            spent += rows;
            if job.encoding.is_done() {
                let job = self.jobs.pop_front().expect("the front job");
                done.push(Encoded {
                    digest: job.digest,
                    image: job.encoding.into_encoded().expect("done"),
                    waiters: job.waiters,
                });
            }
        }
        done
    }
}
