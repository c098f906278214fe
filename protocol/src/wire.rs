//! `wire_enum!`: an ABI enum and its wire values from one table.
//!
//! Each variant is listed once, with its wire value and its name; the macro derives the
//! `#[repr]` discriminants, `raw()`, `from_raw()`, `TryFrom<raw>` and `name()` from that list,
//! so the two directions of the mapping cannot drift apart.

/// A wire value that names no variant of the enum it was decoded into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownWireValue(pub u64);

impl core::fmt::Display for UnknownWireValue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "unknown wire value {}", self.0)
    }
}

macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $raw:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[repr($raw)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $value, )+
        }

        impl $name {
            /// Every variant, in table order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value that travels over the ABI.
            pub const fn raw(self) -> $raw {
                self as $raw
            }

            /// The variant with wire value `raw`, if any.
            pub const fn from_raw(raw: $raw) -> Option<$name> {
                match raw {
                    $( $value => Some($name::$variant), )+
                    _ => None,
                }
            }

            /// The name used in docs and messages.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl TryFrom<$raw> for $name {
            type Error = $crate::wire::UnknownWireValue;
            fn try_from(raw: $raw) -> Result<$name, Self::Error> {
                $name::from_raw(raw).ok_or($crate::wire::UnknownWireValue(raw as u64))
            }
        }

        impl From<$name> for $raw {
            fn from(value: $name) -> $raw {
                value.raw()
            }
        }
    };
}
pub(crate) use wire_enum;

#[cfg(test)]
mod tests {
    wire_enum! {
        enum Sample: u32 {
            A = 1 => "a",
            B = 7 => "b",
        }
    }

    #[test]
    fn both_directions_come_from_the_table() {
        for &v in Sample::ALL {
            assert_eq!(Sample::from_raw(v.raw()), Some(v));
            assert_eq!(Sample::try_from(u32::from(v)), Ok(v));
        }
        assert_eq!(Sample::B.raw(), 7);
        assert_eq!(Sample::A.name(), "a");
        assert_eq!(Sample::try_from(2), Err(super::UnknownWireValue(2)));
    }
}
