//! The codec of the generated server stubs: prost's, except that a request body that does not
//! decode is the caller's fault, `INVALID_ARGUMENT`, where tonic-prost answers `INTERNAL`
//! (which clients read as a server fault). The client stubs keep tonic-prost's codec: a reply
//! that does not decode is a server fault.

use prost::Message;
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// [`tonic_prost::ProstCodec`] with undecodable requests mapped to `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct RequestCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for RequestCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for RequestCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(ProstDecoder::default())
    }
}

/// Decodes one request message; see [`RequestCodec`].
#[derive(Debug, Clone, Default)]
pub struct RequestDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            Status::invalid_argument(format!(
                "request body is not a valid {}: {}",
                std::any::type_name::<U>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("message"),
                s.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
